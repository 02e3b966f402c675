"""Credential redaction: every URL form redis-py accepts, and error texts that quote pieces of it."""

from __future__ import annotations

import pytest

from common.connection import (connect, is_sentinel, parse_sentinel_url, primary_address, primary_changes, redact,
                               scrub, with_retries)

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
    # Sentinel addresses: the Redis servers' password and the sentinels' own
    (f"redis+sentinel://rqrl:{SECRET}@s1:26379,s2:26379/mymaster/0",
     "redis+sentinel://rqrl:***@s1:26379,s2:26379/mymaster/0"),
    (f"rediss+sentinel://s1,s2/mymaster?sentinel_password={SECRET}&ssl_ca_certs=/ca.crt",
     "rediss+sentinel://s1,s2/mymaster?sentinel_password=***&ssl_ca_certs=/ca.crt"),
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


def test_sentinel_urls_parse_into_sentinels_service_and_both_credentials():
    sentinels, service, kw, skw = parse_sentinel_url(
        f"redis+sentinel://rqrl:{SECRET}@s1:26379,s2,[::1]:26380/mymaster/2?sentinel_password=sp&socket_keepalive=true")
    assert sentinels == [("s1", 26379), ("s2", 26379), ("::1", 26380)] and service == "mymaster"
    assert kw == {"username": "rqrl", "password": SECRET, "db": 2, "socket_keepalive": True}
    assert skw == {"password": "sp"}
    _, _, kw, skw = parse_sentinel_url("rediss+sentinel://:pw@s1/mymaster?ssl_ca_certs=/ca.crt")
    assert kw["ssl"] is True and kw["ssl_ca_certs"] == "/ca.crt" and kw["db"] == 0 and kw["password"] == "pw"
    assert skw == {"ssl": True, "ssl_ca_certs": "/ca.crt"}  # TLS to the sentinels too, same arguments


@pytest.mark.parametrize("url,why", [
    ("redis+sentinel://s1:26379", "SERVICE"),  # no service name
    ("redis+sentinel://s1:26379/mymaster/x", "SERVICE"),  # db not a number
    ("redis+sentinel:///mymaster", "SERVICE"),  # no sentinel
    (f"redis+sentinel://u:{SECRET}@s1:2x/mymaster", "bad sentinel address"),
    (f"redis+sentinel://u:{SECRET}@s1/mymaster?db=2x", "bad redis url"),
])
def test_bad_sentinel_urls_fail_in_one_line_without_the_password(url, why):
    with pytest.raises(ValueError) as err:
        connect(url)
    assert why in str(err.value) and SECRET not in str(err.value) and "\n" not in str(err.value)


def test_a_sentinel_client_and_its_retrying_copy_share_one_sentinel_and_start_with_no_failover():
    conn = connect(f"redis+sentinel://:{SECRET}@127.0.0.1:1,127.0.0.1:2/mymaster/3")  # nothing is contacted yet
    assert is_sentinel(conn) and primary_changes(conn) == [] and primary_address(conn) == ""
    copy = with_retries(conn)
    assert is_sentinel(copy) and copy.connection_pool.sentinel_manager is conn.connection_pool.sentinel_manager
    assert copy.connection_pool.connection_kwargs["db"] == 3 and copy.connection_pool.service_name == "mymaster"
    assert not is_sentinel(connect("redis://127.0.0.1:1/0")) and primary_changes(connect("redis://127.0.0.1:1/0")) == []
