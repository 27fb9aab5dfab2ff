"""The providers' public price lists, read into rows of infra/price_table.json.

One module per cloud, each of one shape:

- `fetch(machines, region, get=http_get) -> list[Row]`: asks the provider (over HTTPS, with a
  timeout) for the machine types' Linux hourly prices in `region`; `get` is the one network call,
  so tests hand it recorded responses.
- `parse(response, machines, region) -> list[Row]`: pure; turns one response document (as the
  provider documents it) into rows, and is what the tests call on recorded responses.
- `SOURCE`: the documented URL the figures come from, and `SPOT`: what the provider publishes of
  spot prices (printed by the refresh when a spot figure stays unknown).

refresh.py runs them (`python -m infra.pricing refresh`) and rewrites the table.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

TIMEOUT_S = 60
"""Per HTTP request: a price list that does not answer in a minute is an error, not a hang."""


class FetchError(RuntimeError):
    """A price list could not be read or did not have the figures; the message names what and why."""


@dataclass(frozen=True)
class Row:
    """One machine type's hourly Linux list prices in one region, as a provider states them."""

    machine: str
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    region: str


@contextmanager
def http_stream(url: str, headers: Mapping[str, str] | None = None) -> Iterator[IO[bytes]]:
    """The body of GET `url` as a binary stream; FetchError on any HTTP or network failure."""
    request = urllib.request.Request(url, headers={"User-Agent": "nanocluster-price-refresh", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            yield response
    except urllib.error.HTTPError as e:  # before URLError, its base class
        body = e.read(500).decode(errors="replace").strip()
        raise FetchError(f"HTTP {e.code} {e.reason} from {url.split('?')[0]}: {body}") from e
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise FetchError(f"no answer from {url.split('?')[0]} within {TIMEOUT_S} s ({e})") from e


def http_get(url: str, headers: Mapping[str, str] | None = None) -> Any:
    """GET `url` and decode its JSON body."""
    with http_stream(url, headers) as body:
        data = body.read()
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise FetchError(f"{url.split('?')[0]} answered with something that is not JSON ({e})") from e


Getter = Callable[..., Any]
"""http_get's signature: (url, headers=None) -> decoded JSON."""
