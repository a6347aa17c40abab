"""What this repository's tests, demos and ``make up`` start beside nats-server: PostgreSQL, a local Airflow, Spark
standalone and Spark Connect servers on loopback. Not part of the shipped provider."""
