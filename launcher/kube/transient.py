"""Transient API errors retried: a run outlives a busy or restarting API server.

An API server answers 429 when it sheds load (API Priority and Fairness, with Retry-After), 5xx while
etcd or the server itself is unavailable (a control plane upgrade or repair: minutes on a zonal GKE
cluster, whose one control plane restarts), and connections reset or time out meanwhile. None of that
says anything about the run, so every request of the launcher's client is retried with a growing
backoff, honouring Retry-After, with a line per retry, for at most RETRY_WINDOW_S; an error that is
not transient (403, 404, 409, 422) is returned at once and ends in api.api_error's one line.

A 401 says the credential expired: an exec plugin's token (gke-gcloud-auth-plugin's lasts an hour) is
only refreshed by the client when the plugin stated its expiry and the clock agrees. The kubeconfig is
then loaded again (its plugin runs again) and the request retried once with the new credential; a
second 401 stands.

A create retried after a reset may have been done the first time: the retry then answers 409, which
create_when_gone (launcher.kube.jobs) tells apart from an older object of the same name by a token it
puts on each object it creates.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client import rest
from urllib3.exceptions import HTTPError

from launcher.console import say

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
"""Answers that say the server could not serve the request now, not that the request is wrong."""
RETRY_WINDOW_S = 300.0
"""How long one request is retried before its error stands: a zonal GKE control plane is unavailable
for several minutes while it is upgraded or repaired; a regional one keeps answering."""
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
"""The wait before the first retry, doubled each time up to this (or the server's Retry-After)."""
REQUEST_TIMEOUT_S = (10.0, 60.0)
"""(connect, read) seconds for a request that is not a follow stream: a server that never answers is a
timeout, retried, never a `fab train` that hangs."""
STREAMING = ("follow=true", "watch=true")


_thread = threading.local()


@contextlib.contextmanager
def abandoned_when(predicate: Callable[[], bool]) -> Iterator[None]:
    """Requests this thread makes while predicate() holds are not retried: a stream follower whose run
    watch has ended, which nobody reads any more, neither waits out the window nor says a line."""
    _thread.abandoned = predicate
    try:
        yield
    finally:
        _thread.abandoned = None


def abandoned() -> bool:
    predicate = getattr(_thread, "abandoned", None)
    return bool(predicate and predicate())


class Backoff:
    """The retries of one request: the next wait, and whether the window allows one more."""

    def __init__(self, what: str, window_s: float, sleep: Callable[[float], None] = time.sleep):
        self.what, self.window_s, self.sleep = what, window_s, sleep
        self.started = time.monotonic()
        self.next_s = FIRST_BACKOFF_S
        self.tries = 0

    def wait(self, why: str, retry_after: str | None) -> bool:
        """Sleep before the next try and say so; False (no sleep) when the window is spent, or when this
        thread's requests are abandoned (abandoned_when)."""
        if abandoned():
            return False
        wait_s = min(self.next_s, MAX_BACKOFF_S)
        if retry_after and retry_after.strip().isdigit():
            wait_s = max(float(retry_after), 0.0)
        left = self.window_s - (time.monotonic() - self.started)
        if wait_s > left:
            return False
        self.tries += 1
        say(
            f"the API server {why} ({self.what}): retrying in {wait_s:g} s "
            f"(try {self.tries + 1}, for up to {self.window_s:g} s)"
        )
        self.sleep(wait_s)
        self.next_s *= 2
        return not abandoned()


def request_what(method: str, url: str) -> str:
    """ "GET /api/v1/namespaces/x/pods": the request, without the server and the query."""
    return f"{method} {urlsplit(url).path}"


class RetryingApiClient(client.ApiClient):
    """The official ApiClient whose every request is retried while its error is transient, and once
    after a 401 with the credential reload() gives. Streams (kubernetes.stream's exec) swap call_api
    on their own client and are not retried here: they are reopened on a new client
    (launcher.kube.streams), which loads the kubeconfig anew."""

    window_s = RETRY_WINDOW_S

    def __init__(self, configuration: client.Configuration, reload: Callable[[], client.Configuration] | None = None):
        super().__init__(configuration)
        self.reload = reload
        """The kubeconfig loaded again (its exec plugin run again): a fresh credential after a 401."""

    def refresh_credentials(self, header_params: dict) -> None:
        """Load the kubeconfig again and put its credential on this client and on the request's headers."""
        assert self.reload is not None
        configuration = self.reload()
        self.configuration = configuration
        self.rest_client = rest.RESTClientObject(configuration)  # a client certificate is the pool's
        for key in [k for k in header_params if k.lower() == "authorization"]:
            del header_params[key]
        bearer = configuration.auth_settings().get("BearerToken")
        if bearer:
            header_params["authorization"] = bearer["value"]

    def call_api(
        self,
        method: str,
        url: str,
        header_params: dict | None = None,
        body: object = None,
        post_params: list | None = None,
        _request_timeout: object = None,
    ) -> rest.RESTResponse:
        if _request_timeout is None and not any(s in url for s in STREAMING):
            _request_timeout = REQUEST_TIMEOUT_S
        backoff = Backoff(request_what(method, url), self.window_s)
        refreshed = False
        header_params = dict(header_params or {})
        while True:
            try:
                response: rest.RESTResponse = super().call_api(
                    method, url, header_params, body, post_params, _request_timeout=_request_timeout
                )
            except (HTTPError, OSError) as e:  # reset, refused, timed out (urllib3 gave up its own retries)
                if backoff.wait(f"did not answer ({type(e).__name__})", None):
                    continue
                raise
            if response.status == 401 and self.reload is not None and not refreshed:
                response.read()
                refreshed = True
                say(
                    f"the API server refused the credential (401 Unauthorized) ({backoff.what}): "
                    "loading the kubeconfig's credential again and retrying once"
                )
                self.refresh_credentials(header_params)
                continue
            if response.status not in TRANSIENT_STATUS:
                return response
            response.read()  # the error's body: the connection goes back to the pool
            answered = f"answered {response.status} {response.reason or ''}".rstrip()
            if not backoff.wait(answered, response.getheader("Retry-After")):
                return response  # the window is spent: the caller raises ApiException as it would have
