"""Where `wireproto analyze` writes: its ``--out`` directory, whole or not at all.

A batch run writes into DIR only once it has succeeded. Spark writes the tables and the report
into a staging directory (``DIR/.wireproto-analyze-PID`` for a local DIR, on its file system so
each output moves into place with a rename; a local temporary directory for DIR in storage),
and `publish` then puts each output in DIR. A run that fails or is stopped leaves DIR as it was.

DIR must be empty or new (`check_out`), so that a report is never written into a directory of
other things by mistake (``--out docs``). With ``--overwrite`` it need not be: each output that
this run writes (the tables' directories, ``report.md`` and its plots) replaces the one of the
same name, and nothing else in DIR is touched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wireproto.pipeline.analyze import Summary

__all__ = ["is_remote", "check_out", "staging", "publish"]

STAGING_PREFIX = ".wireproto-analyze-"


def is_remote(location: str) -> bool:
    """Whether `location` is in object storage or another filesystem pyarrow reaches
    (``s3://``, ``gs://``, ``hdfs://``), not a local path."""
    return "://" in location and not location.startswith("file://")


def check_out(out: str, options: dict[str, str], *, overwrite: bool) -> str | None:
    """Why `out` cannot take a batch run's outputs, or None: it is not a directory, or it holds
    something and `overwrite` is not given."""
    if is_remote(out):
        import pyarrow.fs as pafs

        from wireproto.capture.storage import open_store

        try:
            store = open_store(out, options)
            if store.filesystem.get_file_info(store.root).type == pafs.FileType.File:
                return f"--out {out!r} is not a directory"
            held = store.filesystem.get_file_info(
                pafs.FileSelector(store.root, allow_not_found=True))
        except (OSError, ValueError) as error:
            return f"--out {out!r}: {str(error).strip().splitlines()[0]}"
        names = [info.base_name for info in held]
    else:
        if os.path.exists(out) and not os.path.isdir(out):
            return f"--out {out!r} is not a directory"
        names = os.listdir(out) if os.path.isdir(out) else []
    if names and not overwrite:
        return (f"--out {out!r} is not empty: give a new or empty directory, or --overwrite to "
                "replace what analyze writes there (its tables, report.md and plots) and leave "
                "the rest")
    return None


@contextmanager
def staging(out: str) -> Iterator[str]:
    """A local directory for a run's outputs, removed after; `out` is left as it was if the
    block fails (a local `out` that did not exist is removed again)."""
    if is_remote(out):
        with tempfile.TemporaryDirectory(prefix="wireproto-analyze-") as directory:
            yield directory
        return
    made = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    directory = os.path.join(out, f"{STAGING_PREFIX}{os.getpid()}")
    shutil.rmtree(directory, ignore_errors=True)
    os.mkdir(directory)
    try:
        yield directory
    except BaseException:
        shutil.rmtree(out if made else directory, ignore_errors=True)
        raise
    shutil.rmtree(directory, ignore_errors=True)


def publish(summary: Summary, staged: str, out: str, options: dict[str, str]) -> Summary:
    """Put each output `staged` holds in `out`, in place of the one of the same name; the
    paths in `summary` then name where the outputs are in `out`."""
    names = sorted(os.listdir(staged))
    if is_remote(out):
        _upload(names, staged, out, options)
    else:
        for name in names:
            target = os.path.join(out, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            elif os.path.lexists(target):
                os.unlink(target)
            os.replace(os.path.join(staged, name), target)

    def moved(path: str) -> str:
        relative = os.path.relpath(path, staged)
        if "://" in path or relative == os.pardir or relative.startswith(os.pardir + os.sep):
            return path  # not one of the staged outputs (an ingested table's rows)
        return f"{out.rstrip('/')}/{Path(relative).as_posix()}" if is_remote(out) else \
            os.path.join(out, relative)

    summary.out = out
    summary.tables = {name: moved(path) for name, path in summary.tables.items()}
    summary.report = moved(summary.report)
    summary.plots = [moved(path) for path in summary.plots]
    return summary


def _upload(names: list[str], staged: str, out: str, options: dict[str, str]) -> None:
    """Copy the outputs to `out` in storage, each in place of the one of the same name (a
    table's old part files would otherwise stay beside the new ones)."""
    import pyarrow.fs as pafs

    from wireproto.capture.storage import open_store

    store = open_store(out, options)
    filesystem = store.filesystem
    filesystem.create_dir(store.root, recursive=True)
    for name in names:
        target = f"{store.root}/{name}"
        found = filesystem.get_file_info(target).type
        if found == pafs.FileType.Directory:
            filesystem.delete_dir(target)
        elif found == pafs.FileType.File:
            filesystem.delete_file(target)
        pafs.copy_files(os.path.join(staged, name), target,
                        source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)
