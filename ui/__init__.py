"""Building blocks of the dashboard pages: cached state, chart builders, comparison arithmetic,
form validation and small widgets. ``charts``, ``scaling`` and ``validation`` are pure (no
streamlit) and unit-tested; ``state``, ``options`` and ``widgets`` draw on streamlit."""
