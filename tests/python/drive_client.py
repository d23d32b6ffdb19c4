"""Drive rush-meter through a client generated from its /openapi.json by
openapi-python-client (tests/openapi.rs generates it into a temporary folder on
PYTHONPATH as `rush_meter_client`): register an org and a key, admit a session,
send its heartbeats, read the usage and end it. Prints what it saw as JSON; any
answer the client cannot parse into its generated models fails the script."""

import datetime
import json
import os
import sys

from rush_meter_client import AuthenticatedClient
from rush_meter_client.api.gate import post_admission
from rush_meter_client.api.ledger import end_session, post_heartbeats
from rush_meter_client.api.orgs import put_key, put_org
from rush_meter_client.api.usage import get_usage
from rush_meter_client.models import (
    AdmissionBody,
    Agent,
    Batch,
    DecisionView,
    EndBody,
    EndStatus,
    HeartbeatResult,
    KeyView,
    OrgView,
    PutKey,
    PutOrg,
    RawHeartbeat,
    RawHeartbeatState,
    SessionView,
    UsageView,
)


def expect(response, model, status=200):
    """The parsed answer, or exit naming what came back instead."""
    if response.status_code != status or not isinstance(response.parsed, model):
        sys.exit(f"expected {status} {model.__name__}, got {response.status_code}: {response.content!r}")
    return response.parsed


def main():
    client = AuthenticatedClient(base_url=os.environ["RUSH_METER_URL"], token=os.environ["RUSH_METER_TOKEN"])
    org = expect(put_org.sync_detailed("genco", client=client, body=PutOrg(name="Gen Co", plan="pro")), OrgView)
    expect(put_key.sync_detailed("genco", "k1", client=client, body=PutKey(concurrency_limit=2)), KeyView)
    decision = expect(
        post_admission.sync_detailed(
            client=client,
            body=AdmissionBody(org_id="genco", key_id="k1", session_id="gen1", agent=Agent.CLAUDE),
        ),
        DecisionView,
    )
    at = datetime.datetime.fromtimestamp(int(os.environ["RUSH_METER_NOW"]), tz=datetime.timezone.utc)
    beats = [
        RawHeartbeat(org_id="genco", session_id="gen1", vm_id="vm1", seq=seq, state=RawHeartbeatState.RUNNING, sent_at=at)
        for seq in (1, 2)
    ]
    answer = post_heartbeats.sync_detailed(client=client, body=Batch(heartbeats=beats))
    if answer.status_code != 200 or not all(isinstance(r, HeartbeatResult) for r in answer.parsed.results):
        sys.exit(f"heartbeats: {answer.status_code}: {answer.content!r}")
    usage = expect(get_usage.sync_detailed("genco", client=client), UsageView)
    ended = expect(
        end_session.sync_detailed("gen1", client=client, body=EndBody(status=EndStatus.COMPLETED)),
        SessionView,
    )
    print(
        json.dumps(
            {
                "plan": org.plan,
                "decision": decision.decision.value,
                "actions": [r.action for r in answer.parsed.results],
                "duplicates": [r.duplicate for r in answer.parsed.results],
                "running_sessions": usage.running_sessions,
                "month_limit_seconds": usage.month.limit_seconds,
                "ended": ended.state.value,
            }
        )
    )


main()
