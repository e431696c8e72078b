"""Training data: the Kafka token source and how packed records become model inputs."""
