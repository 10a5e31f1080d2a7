"""kvgateway.log.resume: a Last-Event-ID resumes inside the ring or not at all."""

from __future__ import annotations

from kvgateway.log.resume import resume_after
from kvgateway.protocol import messages


def test_resume_after_is_all_or_nothing() -> None:
    assert resume_after("e:4", epoch="e", first_offset=5, last_offset=9) == 4
    assert resume_after("e:9", epoch="e", first_offset=5, last_offset=9) == 9
    assert resume_after("e:3", epoch="e", first_offset=5, last_offset=9) is None
    assert resume_after("e:10", epoch="e", first_offset=5, last_offset=9) is None
    assert resume_after("f:6", epoch="e", first_offset=5, last_offset=9) is None
    assert resume_after("e:0", epoch="e", first_offset=1, last_offset=0) == 0
    assert messages.parse_message_id("ab:12") == ("ab", 12)
    assert messages.parse_message_id("ab:12\n") is None
