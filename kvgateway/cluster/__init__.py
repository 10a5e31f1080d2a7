"""kvgateway past one process: the ordered log on NATS JetStream, an ingest role that publishes to
it, edge roles that follow it and serve the web protocol, and a supervisor for one machine."""
