"""Reports on runs, built the same way for the command line and the dashboard: comparison
arithmetic (``scaling``), every Plotly figure (``charts``, ``series_charts``, ``confusion_charts``,
``profile_charts``, ``efficiency``), profile tables (``profile``), the sweep's table, advice and HTML page
(``sweep_report``) and its forecast (``scaling_forecast``). The figures live here, not in ``ui``, because the
HTML reports that the ``parallax`` command writes draw them too, and the command sits below the dashboard. Pure functions of the database's rows to
DataFrames, Plotly figures and HTML: no streamlit here, and nothing from ``ui``."""
