"""The JetStream view in Airflow's UI: an Airflow 3 plugin (FastAPI app + external view) and the extra link."""
