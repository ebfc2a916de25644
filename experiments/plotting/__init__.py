"""Loading, tables and figures of kvouter results (imported through experiments/plot.py)."""
