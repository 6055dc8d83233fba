"""Secrets kept out of what is printed and stored: a URI's password, a secret query value or a
secret-named key's value redacted; and the Authorization header MLflow's client sends a server."""

from __future__ import annotations

import base64
import os
import re
import urllib.parse

# user:password@ as SQLAlchemy reads it (sqlalchemy.engine.url): the password runs to the first @,
# so it may hold / # ? where urllib's split ends the host part and sees no password at all.
CREDENTIALS = re.compile(r"^(?P<head>[\w+.-]+://[^:/]*):(?P<password>[^@]*)@")


# A key that names a secret (psycopg takes ?password= and ?sslpassword=; S3 clients an
# aws_secret_access_key), but not a word that merely starts like one (token_acc, a score).
_SECRET_KEY = (
    r"[\w-]*?(?:password|passwd|pwd|secret|token|secret_access_key|secret_key|access_key_id|api_key)\b"
)


# user:password@ of any URI in a line (a user name may hold @, Azure's user@server); the password
# runs to the last @ before a space or quote, so that an unencoded @ in it leaves no tail behind;
# digits then / ? # after the colon are a port (http://host:8080/a@b), not a password (the URI
# in use is redacted exactly, whatever its password, by redact and redact_text).
_URI_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][\w+.-]*://[^:/\s'\"]*):(?!\d*[/?#])[^\s'\"]*@")


_QUERY_SECRET = re.compile(rf"(?i)(?P<head>[?&;]{_SECRET_KEY}=)[^&#\s'\")\]}}`]*")


# A mapping's value (a query's was redacted above): a quoted one to its closing quote, a plain one
# to the next delimiter; the plain one becomes '***', which a YAML reader takes for a string, not an
# alias, so that a stored file stays readable.
_KEY_SECRET = re.compile(
    rf"(?i)(?<![?&;\w-])(?P<head>['\"]?{_SECRET_KEY}['\"]?\s*[:=]\s*)"
    rf"(?:(?P<quote>['\"])(?:(?!(?P=quote)).)*(?P=quote)|[^'\",;)\]}}`\s]+)"
)


def redact_secrets(text: str) -> str:
    """`text` (a message, a traceback, a file) with every secret it shows as a URI's password, a
    URI's secret query value or a secret-named key's value replaced by ***."""
    text = _QUERY_SECRET.sub(r"\g<head>***", _URI_PASSWORD.sub(r"\g<head>:***@", text))
    return _KEY_SECRET.sub(
        lambda m: m["head"] + (f"{m['quote']}***{m['quote']}" if m["quote"] else "'***'"), text
    )


def redact(uri: str) -> str:
    """The URI without its password, for messages and for what is stored."""
    return _QUERY_SECRET.sub(r"\g<head>***", CREDENTIALS.sub(r"\g<head>:***@", uri, count=1))


def redact_text(text: str, uri: str) -> str:
    """`text` (a search-space file, an error) without secrets (redact_secrets), nor the password of
    `uri` where it stands in a URI, however odd its characters: a password that is also a common
    word leaves the rest of the text alone."""
    found = CREDENTIALS.match(uri)
    text = text.replace(f":{found['password']}@", ":***@") if found and found["password"] else text
    return redact_secrets(text)


def without_userinfo(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def url_auth_headers(uri: str) -> dict[str, str]:
    """Basic auth from an http(s) URI's user:password@, as MLflow's client (requests) sends it."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None:
        return {}
    user, password = urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or "")
    return {"Authorization": "Basic " + base64.b64encode(basic_credentials(user, password)).decode()}


def basic_credentials(user: str, password: str) -> bytes:
    """user:password as requests (MLflow's client) encodes it for basic auth: latin-1 where it can."""
    try:
        return f"{user}:{password}".encode("latin-1")
    except UnicodeEncodeError:
        return f"{user}:{password}".encode()


def auth_headers() -> dict[str, str]:
    """The Authorization header MLflow's client sends a tracking server, from the same variables:
    a token (MLFLOW_TRACKING_TOKEN) or basic auth (MLFLOW_TRACKING_USERNAME / _PASSWORD)."""
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(basic_credentials(user, password)).decode()}
    return {}
