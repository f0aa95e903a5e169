"""Settings: the home's webhooks, told when a run ends, diverges or stalls (db/notify.py).

URLs carry their secrets, so the page shows each one's scheme and host only; the list is kept in
``$PARALLAX_HOME/webhooks``, readable by its owner alone, never in the database."""

from __future__ import annotations

import os

import streamlit as st

from db import notify
from ui import state
from ui.text import escape_markdown

state.enter_through_app("pages/settings.py")

st.title("Settings")
st.subheader("Webhooks")
st.caption("Parallax posts to each webhook when a run completes, fails, is cancelled or lost, trains on through "
           "a NaN loss, or stalls: one JSON object with the run's id, link, status, reason, best accuracy and "
           "duration, which Slack (its `text`) and Discord (its `content`) read as they are. Set them here or in "
           f"`{notify.WEBHOOKS_ENV}` (comma-separated) where the dashboard and the runs start.")

link, link_source = notify.dashboard_url()
st.caption(f"Links in messages open this address ({escape_markdown(link_source)}; set `{notify.DASHBOARD_URL_ENV}` "
           "where the runs start to send them elsewhere):")
st.code(f"{link}/run?run=N", language=None, width="content")

from_environment = [u.strip() for u in os.environ.get(notify.WEBHOOKS_ENV, "").split(",") if u.strip()]
if from_environment:
    st.markdown(f"From `{notify.WEBHOOKS_ENV}`: " + ", ".join(f"`{notify.shown_url(u)}`" for u in from_environment))
kept = notify.settings_webhooks()
st.markdown("Kept here: " + (", ".join(f"`{notify.shown_url(u)}`" for u in kept) if kept else "none"))

with st.form("webhooks"):
    text = st.text_area("Replace the webhooks kept here: one URL a line (empty removes them)", height=110,
                        placeholder="https://hooks.slack.com/services/…\nhttps://discord.com/api/webhooks/…")
    if st.form_submit_button("Save", icon=":material/save:"):
        try:
            notify.save_webhooks(text.splitlines())
        except ValueError as exc:
            st.error(escape_markdown(str(exc)), icon=":material/error:")
        except OSError as exc:
            st.error(escape_markdown(f"the webhooks could not be saved: {exc}"), icon=":material/error:")
        else:
            st.rerun()

if (kept or from_environment) and st.button("Send a test message", icon=":material/send:"):
    for url, taken in notify.send_test_message().items():
        (st.success if taken else st.error)(f"{url} {'took it' if taken else 'did not take it (see the log)'}")
