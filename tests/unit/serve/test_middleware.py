"""The Host check's verdicts, kept per header: the same answers as the rule itself, bounded."""

from __future__ import annotations

from kvgateway.config.settings import Settings
from kvgateway.runtime.metrics import Metrics
from kvgateway.serve.middleware import HOST_VERDICTS, HostCheck


def check() -> HostCheck:
    async def app(scope: object, receive: object, send: object) -> None:
        return None

    return HostCheck(app, Settings(host="127.0.0.1", allowed_hosts=("gateway.example",)), Metrics())


def test_a_kept_verdict_is_the_rules_own_answer_each_time() -> None:
    host = check()
    for _ in range(3):  # the first answer is the rule's, the next ones the kept verdict
        assert host.allows("127.0.0.1:8080")
        assert host.allows("localhost:8080")
        assert host.allows("gateway.example:443")
        assert not host.allows("attacker.example")
        assert not host.allows("attacker.example:8080")
        assert host.allows(None)


def test_the_verdicts_kept_are_bounded_and_forgetting_them_changes_no_answer() -> None:
    host = check()
    for n in range(HOST_VERDICTS * 3):
        assert not host.allows(f"rebound-{n}.example")
        assert len(host._verdicts) <= HOST_VERDICTS
    assert host.allows("[::1]:8080")
    assert not host.allows("rebound-0.example")
