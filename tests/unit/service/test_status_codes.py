"""The status table's client messages (service/status_codes.py): request strings quoted back are bounded, so the
trailers stay under gRPC's metadata limit and the client sees the real status (found by tests/fuzz)."""

from __future__ import annotations

import grpc

from service import status_codes
from service.core import errors
from service.status_codes import MAX_MESSAGE_BYTES, MAX_QUOTED_CHARS, bounded_message


def test_a_short_message_is_unchanged():
    message = "model 'simple' has no input 'INPUT9'"
    assert bounded_message(message) == message


def test_a_long_quoted_string_keeps_its_head_tail_and_length():
    name = "a" * 5_000 + "TAIL"
    message = bounded_message(f"no model named {name!r} is registered")
    assert message.startswith("no model named 'aaaa")
    assert "TAIL' (5004 characters) is registered" in message
    assert len(message) < MAX_QUOTED_CHARS + 80


def test_both_quote_styles_are_shortened():
    name = "it's " + "b" * 500
    message = bounded_message(f"input {name!r} is unknown")  # repr picks double quotes here
    assert message.startswith("input \"it's bbb") and "(505 characters)" in message


def test_a_quoted_string_at_the_limit_is_kept_whole():
    name = "c" * (MAX_QUOTED_CHARS + 2)
    assert bounded_message(f"model {name!r}") == f"model {name!r}"


def test_text_between_two_short_quoted_names_is_left_alone():
    """The closing quote of one name and the opening quote of the next do not make a quoted string."""
    message = f"region 'a' of {'x' * 200} and region 'b'"
    assert bounded_message(message) == message


def test_a_long_quoted_name_after_a_short_one_is_still_shortened():
    long_name = "n" * 300
    message = bounded_message(f"input 'a' and input '{long_name}'")
    assert message.startswith("input 'a' and input 'nnn") and "(300 characters)" in message


def test_an_unquoted_long_message_is_cut_by_utf8_bytes_without_splitting_a_character():
    message = bounded_message("\u00e9" * 4_000)
    assert len(message.encode("utf-8")) <= MAX_MESSAGE_BYTES
    assert message.endswith("(8000 bytes, cut)")
    message.encode("utf-8").decode("utf-8")  # still valid UTF-8


def test_describe_bounds_the_message_but_keeps_code_and_reason():
    code, message, reason = status_codes.describe(errors.ModelNotFound("x" * 10_000))
    assert code == grpc.StatusCode.NOT_FOUND and reason == "model_not_found"
    assert len(message.encode("utf-8")) <= MAX_MESSAGE_BYTES and "(10000 characters)" in message
