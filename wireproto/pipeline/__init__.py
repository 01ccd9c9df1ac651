"""The data pipeline over capture files (docs/pipeline.md).

- `wireproto.pipeline.decode`: a capture record's message decoded with wireproto's own codecs
  into analysis columns (message type, topic, request id, body size, decode error). No Spark.
- `wireproto.pipeline.datasource`: `WireCaptureDataSource`, the PySpark Python data source
  named ``wirecapture``. It needs the ``spark`` extra (``pip install 'wireproto[spark]'``), so
  this package does not import it.
"""
