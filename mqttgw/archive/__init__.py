"""What the gateway carries, recorded: the Parquet archive the pipeline reads."""
