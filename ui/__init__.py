"""Building blocks of the dashboard pages: cached state, views, form validation and small
widgets (the figures they show are built in ``reports``). ``validation`` is pure (no streamlit) and unit-tested; ``state``, ``options``
and ``widgets`` draw on streamlit. The numbers and reports the pages share with the command line
(comparison arithmetic, profile and sweep reports) are built in ``reports``."""
