"""Reports on runs, built the same way for the command line and the dashboard: comparison
arithmetic (``scaling``), profile charts and tables (``profile_charts``, ``profile``) and the
sweep's table, advice and HTML page (``sweep``). Pure functions of the database's rows to
DataFrames, Plotly figures and HTML: no streamlit here, and nothing from ``ui``."""
