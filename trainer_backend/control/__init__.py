"""The control side: what the dashboard's pages and the command line call.

    browser ─▶ pages ─▶ control.lifecycle.launch ──detached process──▶ supervisor (python -m trainer_backend supervisor N)
                        control.lifecycle.cancel ──signal / mark──▶ the run's processes
                        control.housekeeping     ──delete──▶ a finished run's rows and folder
    terminal ─▶ control.cli (python -m trainer_backend …), control.command (parallax …)

It validates, launches, cancels and deletes; it never trains and never imports torch at import time.
"""
