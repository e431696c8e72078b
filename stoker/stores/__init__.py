"""Where a drop lives (a local folder, S3, HDFS), whether it is complete, and Spark's connectors to them."""
