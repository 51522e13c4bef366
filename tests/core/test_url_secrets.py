"""A Redis URL's secrets stay out of every message, and a bad URL is one clear ValueError from core.connect.

The gaps closed here: a password written as the user name (`redis://secret@host`), `?password=` in any case,
a password holding an unencoded '/', '?' or '#' (redis-py's own port error then quotes its start), and an
unknown query argument (redis-py raises TypeError only at the first command)."""
from __future__ import annotations

import pytest
import redis

from moe_monitor import core
from moe_monitor.core.redaction import redact, scrub, secrets_of
from moe_monitor.demo.localredis import RedisServer

SECRET = "Zq8-secret-pw"


@pytest.mark.parametrize(("url", "shown"), [
    (f"redis://{SECRET}@h:6379/0", "redis://***@h:6379/0"),                       # a lone user info
    (f"redis://default:{SECRET}@h:6379/0", "redis://default:***@h:6379/0"),
    (f"redis://h:6379/0?password={SECRET}&db=2", "redis://h:6379/0?password=***&db=2"),
    (f"redis://h:6379/0?PASSWORD={SECRET}", "redis://h:6379/0?PASSWORD=***"),
    (f"rediss://h:6380/0?ssl_password={SECRET}&ssl_ca_certs=/a/b.pem",
     "rediss://h:6380/0?ssl_password=***&ssl_ca_certs=/a/b.pem"),
    (f"redis://:se/{SECRET}@h:6379/0", "redis://:***@h:6379/0"),                   # unencoded '/' in the password
    (f"redis://:se?{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
    (f"redis://:se#{SECRET}@h:6379/0", "redis://:***@h:6379/0"),
    (f"redis://us/er:{SECRET}@h:6379/0", "redis://***@h:6379/0"),
    (f"unix:///run/redis.sock?password={SECRET}", "unix:///run/redis.sock?password=***"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_redact_every_form(url, shown):
    assert redact(url) == shown
    assert redact(redact(url)) == shown  # the sidebar compares typed text with the redacted URL: stable
    assert SECRET not in redact(url)


def test_redact_text_holding_urls_keeps_its_words():
    text = f"cannot reach redis://{SECRET}@h:1/0 nor rediss://u:{SECRET}@g:2/0?x=1 (timeout)"
    assert redact(text) == "cannot reach redis://***@h:1/0 nor rediss://u:***@g:2/0?x=1 (timeout)"
    assert redact("Error 111 connecting to 127.0.0.1:6379. Connection refused.") == \
        "Error 111 connecting to 127.0.0.1:6379. Connection refused."
    assert SECRET not in redact(f"redis//:{SECRET}@host") and SECRET not in redact(f"h:1/0?password={SECRET}")


def test_scrub_hides_the_secrets_a_message_quotes():
    url = f"redis://u:{SECRET}@h:1/0?password=other-Secret"
    said = scrub(f"AUTH {SECRET} refused for {url}; tried other-Secret", url)
    assert SECRET not in said and "other-Secret" not in said and "redis://u:***@h:1/0" in said
    assert secrets_of("redis://h:1/0") == []


@pytest.mark.parametrize("password", [f"se/{SECRET}", f"se?{SECRET}", f"se#{SECRET}"])
def test_an_unencoded_password_is_said_without_its_start(password):
    url = f"redis://:{password}@127.0.0.1:6379/0"
    with pytest.raises(ValueError) as raw:  # what redis-py says itself: the start of the password
        redis.Redis.from_url(url)
    assert "se" in str(raw.value)
    with pytest.raises(ValueError, match="percent-encode") as err:
        core.connect(url)
    assert "'se" not in str(err.value) and SECRET not in str(err.value)
    assert str(err.value).startswith("Redis URL 'redis://:***@127.0.0.1:6379/0'")


@pytest.mark.parametrize(("url", "says"), [
    ("redis://127.0.0.1:6379/0?bogus=1", "unknown option 'bogus'"),
    (f"redis://127.0.0.1:6379/0?PASSWORD={SECRET}", "options are lower case: password"),
    (f"redis://:{SECRET}@127.0.0.1:12x/0", "the port must be a number"),
    (f"redis://:{SECRET}@127.0.0.1:99999/0", "the port must be a number"),
    ("redis://127.0.0.1:6379/zero", "the path must be the database number"),
    ("redis://127.0.0.1:6379/0?db=x", "Invalid value for 'db'"),
    ("redis://127.0.0.1:6379/0?protocol=7", "protocol must be either 2 or 3"),
    ("redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.pem", "rediss:// (TLS) URLs only"),
    (f"rediss://127.0.0.1:6379/0?ssl_cert_reqs=bogus&ssl_password={SECRET}", "refused the value of one of its options"),
    ("redis://127.0.0.1:6379/0?decode_responses=1", "unknown option 'decode_responses'"),
    ("redis://[::1/0", "not a valid URL"),
    (f"http://:{SECRET}@127.0.0.1:6379", "must start with redis://, rediss:// or unix://"),
])
def test_a_bad_url_is_one_value_error_from_the_factory(url, says):
    with pytest.raises(ValueError) as err:
        core.connect(url)
    assert type(err.value) is ValueError
    assert says in str(err.value) and SECRET not in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_option_was_a_type_error_at_the_first_command(redis_server, redis_url):
    url = f"redis://127.0.0.1:{redis_server.port}/0?bogus=1"
    with pytest.raises(TypeError):  # redis-py on its own: the URL is taken, the first command fails
        redis.Redis.from_url(url).ping()
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        core.connect(url)


def test_good_urls_still_connect(redis_server, redis_url):
    port = redis_server.port
    for url in (f"redis://127.0.0.1:{port}", f"redis://127.0.0.1:{port}/", f"redis://127.0.0.1:{port}/3",
                f"redis://127.0.0.1:{port}/0?client_name=dash&socket_timeout=2&health_check_interval=5"):
        assert core.connect(url, timeout_s=2.0).ping()


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("locked"), password=SECRET)
    yield server
    server.stop()


@pytest.mark.parametrize("form", ["redis://{pw}@127.0.0.1:{port}/0", "redis://127.0.0.1:{port}/0?password=wrong-{pw}",
                                  "redis://:wrong-{pw}@127.0.0.1:{port}/0"])
def test_what_a_locked_server_answers_never_carries_the_secret(locked, form):
    url = form.format(pw=SECRET, port=locked.port)
    client = core.connect(url, timeout_s=2.0, retries=0)
    assert SECRET not in repr(client)
    with pytest.raises(redis.RedisError) as err:
        client.ping()
    assert SECRET not in scrub(f"{type(err.value).__name__}: {err.value}", url)


def test_the_right_password_in_the_query_reaches_the_locked_server(locked):
    url = f"redis://127.0.0.1:{locked.port}/0?password={SECRET}"
    assert core.connect(url, timeout_s=2.0).ping()
    assert redact(url) == f"redis://127.0.0.1:{locked.port}/0?password=***"
