"""What operators see: the admin HTTP API, Prometheus metrics, $SYS topics and the dashboard."""
