"""Credential redaction: every URL form redis-py accepts, and error texts that quote pieces of it."""

from __future__ import annotations

import pytest

from common.connection import connect, redact, scrub

SECRET = "S3cr-et9"


@pytest.mark.parametrize("url,shown", [
    (f"redis://rqrl:{SECRET}@10.0.0.1:6379/0", "redis://rqrl:***@10.0.0.1:6379/0"),
    (f"redis://:{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
    (f"redis://{SECRET}@h:6379", "redis://***@h:6379"),  # a bare userinfo may be a password
    (f"rediss://u:{SECRET}@h/0?ssl_ca_certs=/etc/ca.crt", "rediss://u:***@h/0?ssl_ca_certs=/etc/ca.crt"),
    (f"unix://:{SECRET}@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
    # redis-py also takes credentials from the query
    (f"redis://h:6379/0?password={SECRET}", "redis://h:6379/0?password=***"),
    (f"redis://h:6379/0?db=2&password={SECRET}&socket_timeout=5", "redis://h:6379/0?db=2&password=***&socket_timeout=5"),
    (f"rediss://h/0?ssl_password={SECRET}", "rediss://h/0?ssl_password=***"),
    (f"unix:///run/redis.sock?password={SECRET}", "unix:///run/redis.sock?password=***"),
    (f"redis://u:a@{SECRET}@h/0?password={SECRET}", "redis://u:***@h/0?password=***"),
    # characters that were not URL-encoded: @ / ? # & inside the password
    (f"redis://u:p@ss/w?rd#{SECRET}@h:6379/0", "redis://u:***@h:6379/0"),
    (f"redis://h/0?password=a&b#c{SECRET}", "redis://h/0?password=***"),
    (f"redis://u:{SECRET}%40x@h/0", "redis://u:***@h/0"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("not a url at all", "not a url at all"),
])
def test_redact_hides_every_credential_form(url, shown):
    assert redact(url) == shown
    assert SECRET not in redact(url)


def test_scrub_removes_secrets_and_their_pieces_from_error_text():
    url = f"redis://u:ab/{SECRET}@h:6379/0"
    # What redis-py says about this URL: it parsed 'ab' as the port.
    text = f"Port could not be cast to integer value as 'ab' in {url} ({SECRET}, {SECRET.replace('-', '%2D')})"
    out = scrub(text, url)
    assert SECRET not in out and "'ab'" not in out and "redis://u:***@h:6379/0" in out
    assert scrub("plain text", None) == "plain text"


def test_connect_parse_errors_carry_no_credential():
    with pytest.raises(ValueError) as err:
        connect("redis://u:pw/" + SECRET + "@h:6379/0")
    assert SECRET not in str(err.value) and "'pw'" not in str(err.value)
