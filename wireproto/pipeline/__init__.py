"""The data pipeline over capture files (docs/pipeline.md).

- `wireproto.pipeline.decode`: a capture record's message decoded with wireproto's own codecs
  into analysis columns (message type, topic, request id, body size, decode error). No Spark.
- `wireproto.pipeline.values`: the numeric readings in a message's document. No Spark.
- `wireproto.pipeline.rows`: capture records as Arrow rows, one per message (needs pyarrow).
- `wireproto.pipeline.datasource`: `WireCaptureDataSource`, the PySpark Python data source
  named ``wirecapture``, for batch reads and streams.
- `wireproto.pipeline.spark`, `analyze`, `report`: ``wireproto analyze``, its Parquet tables
  and its report; `wireproto.pipeline.follow`: ``wireproto analyze --follow``.
- `wireproto.pipeline.tablestore`: a table in object storage (a staging table uploaded, a
  reader's local copy) and removing the files out of a table's log; pyarrow, no Spark.

All but `decode` and `values` need the ``spark`` extra (``pip install -e '.[spark]'`` in a
checkout; `wireproto analyze` names its packages when they are missing), so this package
imports none of them.
"""
