"""Command-line clients in the spirit of mosquitto_pub and mosquitto_sub: ``wireproto pub``,
``sub``, ``call``, ``produce`` and ``events``.

Each tool module has ``register(commands)``, which adds its subcommands to the ``wireproto``
parser (`wireproto.cli.COMMANDS` names each command's module) with ``set_defaults(run=...)``;
``run(args) -> int`` is the exit status. `_common` holds what they share: the exit codes,
reading an address, payloads from stdin, output, and one-line errors.
"""
