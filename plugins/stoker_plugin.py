"""Entry point Airflow imports from the plugins folder; the code lives in the stoker_airflow package
(installed with the project, so the triggerer and the workers import it by its package name)."""

from stoker_airflow.plugin import StokerPlugin

__all__ = ["StokerPlugin"]
