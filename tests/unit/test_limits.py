"""dlm.limits: the shared rules on keys, names and values."""

from __future__ import annotations

import random

from dlm.limits import check_identity_name, check_key, check_meta, has_control, is_control


def test_has_control_agrees_with_the_character_rule() -> None:
    rng = random.Random(14)
    alphabet = [0, 0x1F, 0x20, 0x41, 0x7E, 0x7F, 0x80, 0x9F, 0xA0, 0xE9, 0xD800, 0xDFFF, 0x1F512]
    for _ in range(20_000):
        text = "".join(
            chr(rng.choice(alphabet) if rng.random() < 0.5 else rng.randrange(0x110000))
            for _ in range(rng.randrange(6))
        )
        assert has_control(text) == any(is_control(ch) for ch in text), repr(text)


def test_identity_names_hold_ascii_letters_digits_dot_underscore_and_dash() -> None:
    """The rule read without a loop over the characters: the same answers as the loop."""

    def by_character(name: str) -> bool:
        return all(c.isascii() and (c.isalnum() or c in "._-") for c in name)

    rng = random.Random(29)
    alphabet = "aZ09._-/ +\x00\u00e9\u0660\U0001d7ce"  # incl. non-ASCII letters and digits
    for _ in range(20_000):
        name = "a" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))
        assert (check_identity_name(name) is None) == by_character(name), repr(name)
    assert check_identity_name("ci-runner_1.prod") is None
    assert check_identity_name("-x") is not None and check_identity_name("") is not None


def test_keys_names_and_values_with_control_characters_are_refused() -> None:
    assert check_key("jobs/nightly") is None
    assert check_key("caf\u00e9") is None
    assert check_key("a\x7fb") is not None
    assert check_key("a\x85b") is not None
    assert check_meta({"host": "web-3"}) is None
    assert check_meta({"ho\tst": "web-3"}) is not None
    assert check_meta({"host": "x\udc80"}) is not None
