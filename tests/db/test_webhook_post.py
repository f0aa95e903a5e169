"""One POST to a webhook (db/webhook_post.py): whatever the HTTP library makes of a URL it refuses, the answer
says so without any part of the URL but its scheme and host, and never raises. The deliveries themselves
(redirects, a receiver answering a byte at a time) are tested against real receivers in test_notify.py.

    .venv/bin/python -m pytest tests/db/test_webhook_post.py -q
"""

from __future__ import annotations

import pytest

from db.webhook_post import post_json, shown_url, url_problem

SECRET = "T0SECRET/B0SECRET"
# Past the check a webhook gets when it is saved or read (url_problem): straight to the HTTP library.
REFUSED_BY_THE_LIBRARY = [f"http://127.0.0.1:9/hooks/{SECRET} x", f"http://127.0.0.1:9/hooks/{SECRET}\n",
                          f"http://127.0.0.1:9/hooks/{SECRET}é", f"http://127.0.0.1:99999/{SECRET}",
                          f"http://127.0.0.1:x{SECRET}/", f"http://[::1/{SECRET}", f"http://127.0.0.1:9/{SECRET}\x7f"]


@pytest.mark.parametrize("url", REFUSED_BY_THE_LIBRARY, ids=range(len(REFUSED_BY_THE_LIBRARY)))
def test_a_url_the_library_refuses_is_an_answer_that_quotes_none_of_it(url):
    answer = post_json(url, b"{}", deadline_s=2.0)
    assert not answer.taken and answer.status == 0
    assert SECRET.split("/")[0] not in answer.problem and "\n" not in answer.problem, answer.problem
    assert url_problem(url) is not None and SECRET.split("/")[0] not in url_problem(url)


def test_shown_url_is_scheme_host_and_port_and_never_raises():
    assert shown_url(f"https://user:pw@hooks.example:8443/services/{SECRET}?token=x") == "https://hooks.example:8443/…"
    assert shown_url(f"https://hooks.example/services/{SECRET}") == "https://hooks.example/…"
    assert shown_url(f"http://hooks.example:port/{SECRET}") == "http://hooks.example/…"  # a port that is no number
    assert shown_url(f"http://[::1/{SECRET}") == "(not a URL)"
    assert shown_url("") == "(not a URL)"
