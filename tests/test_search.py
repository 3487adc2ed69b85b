"""The harness's decoder (crashbench.evidence.search): a run's job ids found by its token in the bytes
queues store, whatever the encoding the issue names, and nothing found by chance or from another run."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from crashbench import jobids
from crashbench.evidence.search import Needle

TOKEN = jobids.token()
JOB = TOKEN + "000042"


def encodings() -> dict[str, bytes]:
    body = json.dumps([[JOB], {}, {"callbacks": None}]).encode()
    return {
        "json": json.dumps({"id": JOB, "payload": '{"n": 42}'}).encode(),
        "json in a json string": json.dumps({"message": json.dumps({"args": [JOB]})}).encode(),
        "pickle": pickle.dumps(("crashbench.designs.handler.handle", (JOB,), {})),
        "msgpack str8": b"\x93\xa1f\xd9" + bytes([len(JOB)]) + JOB.encode() + b"\x80",
        "prefixed member": f"job:{JOB}".encode(),
        "celery-like base64 body": json.dumps({"body": base64.b64encode(body).decode()}).encode(),
        "base64, 1 byte before": base64.b64encode(b"x" + JOB.encode()),
        "base64, 2 bytes before": base64.b64encode(b"xy" + JOB.encode()),
        "url-safe base64": base64.urlsafe_b64encode(b"\xff\xfe" + JOB.encode() + b"\xfb"),
    }


@pytest.mark.parametrize("name", list(encodings()))
def test_the_token_is_found_in_every_encoding_queues_use(name: str) -> None:
    assert Needle(TOKEN).ids(encodings()[name]) == ["000042"]


def test_several_ids_in_one_entry_are_all_found_in_order() -> None:
    data = f"[{TOKEN}000007, {TOKEN}000003, {TOKEN}1000000]".encode()
    assert Needle(TOKEN).ids(data) == ["000007", "000003", "1000000"]


def test_nothing_is_found_by_chance_nor_from_another_run() -> None:
    other = jobids.token()
    needle = Needle(TOKEN)
    assert needle.ids(json.dumps({"id": other + "000042", "n": 42, "at": "000042"}).encode()) == []
    assert needle.ids(base64.b64encode(("x" + other + "000042").encode())) == []
    assert needle.ids(TOKEN.encode() + b"no digits") == []


def test_a_token_is_registered_and_stripped_only_in_this_process() -> None:
    run_token = jobids.token()
    assert jobids.is_token(run_token) and not jobids.is_token("cb0000000000-")
    assert jobids.canonical(run_token + "000042") == run_token + "000042"  # not registered yet
    jobids.register(run_token)
    assert jobids.canonical(run_token + "000042") == "000042"
    assert jobids.code(run_token + "000042") == 42 == jobids.code("000042")
    assert jobids.plain(jobids.token() + "000042") == "000042"  # the workload's view: any token's look
    with pytest.raises(ValueError):
        jobids.register("not-a-token")
