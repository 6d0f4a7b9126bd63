"""
The PySpark pipeline over the message archive: per-topic and per-client
rollups, last known values and optional JSON field statistics, as Parquet
tables; in batch or with Structured Streaming; and the latest rollups
published back into the gateway as retained messages.

    python -m mqttgw.pipeline batch --archive DIR --out DIR
    python -m mqttgw.pipeline stream --archive DIR --out DIR --checkpoint DIR
"""
