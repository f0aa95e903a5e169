"""Building blocks of the dashboard pages: cached state, chart builders, form validation and small
widgets. ``charts`` and ``validation`` are pure (no streamlit) and unit-tested; ``state``, ``options``
and ``widgets`` draw on streamlit. The numbers and reports the pages share with the command line
(comparison arithmetic, profile and sweep reports) are built in ``reports``."""
