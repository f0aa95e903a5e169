"""Parallax dashboard entry point: ``make run`` (or ``streamlit run app.py``).

For now one page: the runs recorded in the database, newest first. Runs are started with
``python -m trainer_backend run ...``.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from db import make_engine, store

st.set_page_config(page_title="Parallax", layout="wide")


@st.cache_resource
def engine():
    return make_engine()


st.title("Parallax")
st.caption("Train image classifiers under different parallel strategies and compare what each buys.")

runs = store.list_runs(engine())
if not runs:
    st.info(
        "No runs yet. Start one from a terminal:\n\n"
        "`python -m trainer_backend run --dataset digits --model resnet18 --strategy ddp --devices cpu,cpu --epochs 5`"
    )
else:
    st.dataframe(
        pd.DataFrame(
            [{"run": r.id, "status": r.status, "strategy": r.strategy, "model": r.model,
              "dataset": r.dataset, "created (UTC)": r.created_at} for r in runs]
        ),
        hide_index=True,
        use_container_width=True,
    )
