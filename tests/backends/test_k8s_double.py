"""The Kubernetes API server double, exercised only through the official client."""

from __future__ import annotations

import json
import sys
import time

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from k8s_double.fixture import k8s_api  # noqa: F401  (the fixture)
from waiting import eventually

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(60)]
NS = "default"


def pod(name, code="print('hi')", *, labels=None, env=None, restart="Never", owner=None,
        **spec):
    """A one-container pod running ``python -c code``."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, owner_references=owner),
        spec=client.V1PodSpec(restart_policy=restart, containers=[client.V1Container(
            name="main", image="python:3.11-slim", command=[sys.executable, "-c", code],
            env=env)], **spec))


def wait_pod(v1, name, until, timeout=20):
    """Watch ``name`` until ``until(pod)``; return that pod."""
    w = watch.Watch()
    for event in w.stream(v1.list_namespaced_pod, NS, field_selector=f"metadata.name={name}",
                          timeout_seconds=timeout):
        if until(event["object"]):
            w.stop()
            return event["object"]
    raise AssertionError(f"pod {name} never reached the expected state")


def phase(*phases):
    return lambda p: p.status.phase in phases


def waiting_reason(p):
    states = p.status.container_statuses or []
    return states[0].state.waiting.reason if states and states[0].state.waiting else None


def until_gone(read, timeout=10):
    def gone() -> bool:
        try:
            read()
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False
    eventually(gone, timeout, what="the object's removal")


def status_body(exc: ApiException) -> dict:
    return json.loads(exc.body)


def raw_post(k8s_api, path, body):
    """POST ``body`` as-is (no client-side model), return ``(code, json)``."""
    resp = urllib3.request("POST", k8s_api.server.host + path, json=body,
                           headers={"Authorization": f"Bearer {k8s_api.token}"})
    return resp.status, resp.json()


@pytest.fixture
def v1(k8s_api):
    return k8s_api.core_v1()


def test_pod_runs_to_succeeded_with_status_log_and_events(v1):
    created = v1.create_namespaced_pod(NS, pod("hello"))
    assert created.status.phase == "Pending" and created.metadata.uid
    assert created.spec.termination_grace_period_seconds == 30       # defaulted
    done = wait_pod(v1, "hello", phase("Succeeded", "Failed"))
    assert done.status.phase == "Succeeded"
    assert done.status.pod_ip == "127.0.0.1" and done.status.host_ip == "127.0.0.1"
    state = done.status.container_statuses[0].state.terminated
    assert (state.exit_code, state.reason) == (0, "Completed")
    assert int(done.metadata.resource_version) > int(created.metadata.resource_version)
    assert v1.read_namespaced_pod_log("hello", NS) == "hi\n"
    reasons = {e.reason for e in v1.list_namespaced_event(
        NS, field_selector="involvedObject.name=hello").items}
    assert {"Scheduled", "Pulled", "Created", "Started"} <= reasons


def test_watch_sees_every_phase_from_a_resource_version(v1):
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("phases", "raise SystemExit(3)"))
    seen = []
    w = watch.Watch()
    for event in w.stream(v1.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=20):
        seen.append((event["type"], event["object"].status.phase))
        if event["object"].status.phase == "Failed":
            w.stop()
    assert seen[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in seen and seen[-1] == ("MODIFIED", "Failed")
    final = v1.read_namespaced_pod("phases", NS).status.container_statuses[0].state.terminated
    assert (final.exit_code, final.reason) == (3, "Error")


def test_expired_resource_version_is_410(k8s_api, v1):
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    k8s_api.server.expire_watch_history()
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(v1.list_namespaced_pod, NS, resource_version=rv,
                                  timeout_seconds=2))
    assert err.value.status == 410


def test_log_follow_and_tail(v1):
    code = "import time\nfor i in range(5):\n    print(i, flush=True); time.sleep(0.05)"
    v1.create_namespaced_pod(NS, pod("counter", code))
    wait_pod(v1, "counter", phase("Running", "Succeeded"))
    lines = list(watch.Watch().stream(v1.read_namespaced_pod_log, "counter", NS))
    assert lines == ["0", "1", "2", "3", "4"]
    wait_pod(v1, "counter", phase("Succeeded"))
    assert v1.read_namespaced_pod_log("counter", NS, tail_lines=2) == "3\n4\n"


def test_log_follow_sends_lines_written_before_its_first_chunk():
    """A follow opened before the container printed anything must still send the line
    written between the request and the stream's first chunk (it once skipped it)."""
    import threading
    from types import SimpleNamespace

    from k8s_double.logs import read_log
    from k8s_double.runner import LogBuffer
    from k8s_double.wire import Request

    pod_object = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    store = SimpleNamespace(cond=threading.Condition(), closed=False,
                            get=lambda kind, ns, name: pod_object)
    buf = LogBuffer()
    run = SimpleNamespace(logs={"c": [buf]}, gone=False)
    api = SimpleNamespace(store=store, kubelet=SimpleNamespace(runs={(NS, "p"): run}))
    stream = read_log(api, Request("GET", "", None, {"follow": "true"}), NS, "p").body
    buf.write(b"0\n")            # after the request, before the first chunk is taken
    first = next(stream)
    buf.write(b"1\n")
    buf.close()
    assert first + b"".join(stream) == b"0\n1\n"


def test_secret_values_reach_the_process_env(v1):
    v1.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="key"), string_data={"token": "s3cret"}))
    stored = v1.read_namespaced_secret("key", NS)
    assert stored.data["token"] in ("czNjcmV0", b"czNjcmV0") and stored.type == "Opaque"
    env = [client.V1EnvVar(name="TOKEN", value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name="key", key="token")))]
    v1.create_namespaced_pod(NS, pod("uses-secret", "import os; print(os.environ['TOKEN'], "
                                     "os.environ['HOSTNAME'])", env=env))
    wait_pod(v1, "uses-secret", phase("Succeeded"))
    assert v1.read_namespaced_pod_log("uses-secret", NS) == "s3cret uses-secret\n"
    assert [s.metadata.name for s in v1.list_namespaced_secret(NS).items] == ["key"]
    v1.delete_namespaced_secret("key", NS)
    until_gone(lambda: v1.read_namespaced_secret("key", NS))


def test_missing_secret_holds_the_pod_until_it_exists(v1):
    env = [client.V1EnvVar(name="K", value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name="later", key="k")))]
    v1.create_namespaced_pod(NS, pod("waits", "import os; print(os.environ['K'])", env=env))
    stuck = wait_pod(v1, "waits", lambda p: waiting_reason(p) == "CreateContainerConfigError")
    assert stuck.status.phase == "Pending"
    assert 'secret "later" not found' in stuck.status.container_statuses[0].state.waiting.message
    v1.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="later"), data={"k": "dg=="}))
    wait_pod(v1, "waits", phase("Succeeded"))
    assert v1.read_namespaced_pod_log("waits", NS) == "v\n"


def test_label_and_field_selectors(v1):
    for name, labels in (("a1", {"app": "a", "tier": "x"}), ("a2", {"app": "a"}),
                         ("b1", {"app": "b", "tier": "x"})):
        v1.create_namespaced_pod(NS, pod(name, labels=labels))

    def names(**kw):
        return sorted(p.metadata.name for p in v1.list_namespaced_pod(NS, **kw).items)
    assert names(label_selector="app=a,tier=x") == ["a1"]
    assert names(label_selector="app=a") == ["a1", "a2"]
    assert names(label_selector="app!=a") == ["b1"]
    assert names(label_selector="app in (a,b),!tier") == ["a2"]
    assert names(field_selector="metadata.name=b1") == ["b1"]
    with pytest.raises(ApiException) as err:
        v1.list_namespaced_pod(NS, field_selector="spec.bogus=1")
    assert err.value.status == 400


def test_delete_running_pod_terms_then_kills(v1):
    polite = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(0)))\n"
              "print('up', flush=True); time.sleep(60)")
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('up', flush=True); time.sleep(60)")
    v1.create_namespaced_pod(NS, pod("polite", polite))
    v1.create_namespaced_pod(NS, pod("stubborn", stubborn))
    for name in ("polite", "stubborn"):
        wait_pod(v1, name, phase("Running"))
        until_log(v1, name, "up\n")
    rv = v1.list_namespaced_pod(NS).metadata.resource_version
    start = time.monotonic()
    marked = v1.delete_namespaced_pod("polite", NS, grace_period_seconds=10)
    assert marked.metadata.deletion_timestamp is not None
    v1.delete_namespaced_pod("stubborn", NS, grace_period_seconds=1)
    deleted = {}
    w = watch.Watch()
    for event in w.stream(v1.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=15):
        if event["type"] == "DELETED":
            deleted[event["object"].metadata.name] = (
                time.monotonic() - start, event["object"].status)
            if len(deleted) == 2:
                w.stop()
    polite_after, polite_status = deleted["polite"]
    stubborn_after, stubborn_status = deleted["stubborn"]
    assert polite_after < 3 and polite_status.phase == "Succeeded"
    assert 0.9 < stubborn_after < 5
    assert stubborn_status.container_statuses[0].state.terminated.exit_code == 137


def until_log(v1, name, text, timeout=10):
    eventually(lambda: v1.read_namespaced_pod_log(name, NS) == text, timeout,
               what="the log showing " + repr(text))


def test_owner_reference_garbage_collection(v1):
    owner = v1.create_namespaced_pod(NS, pod("owner", "import time; time.sleep(60)"))
    ref = [client.V1OwnerReference(api_version="v1", kind="Pod", name="owner",
                                   uid=owner.metadata.uid, controller=True)]
    v1.create_namespaced_pod(NS, pod("child", "import time; time.sleep(60)", owner=ref))
    v1.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name="child-key", owner_references=ref),
        string_data={"k": "v"}))
    v1.create_namespaced_pod(NS, pod("bystander", "import time; time.sleep(60)"))
    wait_pod(v1, "child", phase("Running"))
    v1.delete_namespaced_pod("owner", NS, grace_period_seconds=0)
    until_gone(lambda: v1.read_namespaced_pod("child", NS))
    until_gone(lambda: v1.read_namespaced_secret("child-key", NS))
    assert v1.read_namespaced_pod("bystander", NS).metadata.deletion_timestamp is None


def test_dangling_owner_reference_is_collected(v1):
    ref = [client.V1OwnerReference(api_version="v1", kind="Pod", name="ghost",
                                   uid="00000000-0000-0000-0000-000000000000")]
    v1.create_namespaced_pod(NS, pod("orphan", owner=ref))
    until_gone(lambda: v1.read_namespaced_pod("orphan", NS))


def test_forbidden_is_403_with_the_rbac_message(k8s_api, v1):
    k8s_api.server.forbid("create", "pods")
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, pod("nope"))
    assert err.value.status == 403
    assert status_body(err.value)["message"] == (
        'pods is forbidden: User "system:serviceaccount:default:default" cannot create '
        'resource "pods" in API group "" in the namespace "default"')
    assert status_body(err.value)["reason"] == "Forbidden"
    v1.list_namespaced_pod(NS)  # other verbs still work
    k8s_api.server.forbid("get", "pods/log")
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod_log("x", NS)
    assert 'pods "x" is forbidden' in status_body(err.value)["message"]


def test_unschedulable_pod_stays_pending_with_event(k8s_api, v1):
    message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    k8s_api.server.unschedulable(message)
    v1.create_namespaced_pod(NS, pod("gpu"))
    stuck = wait_pod(v1, "gpu", unschedulable)
    assert stuck.status.phase == "Pending"
    assert stuck.status.conditions[0].status == "False"
    assert stuck.status.conditions[0].message == message
    events = v1.list_namespaced_event(NS, field_selector="involvedObject.name=gpu").items
    assert [(e.reason, e.message, e.type) for e in events] == [
        ("FailedScheduling", message, "Warning")]
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod_log("gpu", NS)
    assert err.value.status == 400
    k8s_api.server.unschedulable(None)
    wait_pod(v1, "gpu", phase("Succeeded"))


def unschedulable(p):
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable"
               for c in p.status.conditions or [])


def test_capacity_keeps_pods_beyond_it_pending_until_it_grows(k8s_api, v1):
    k8s_api.server.capacity(1)
    for name in ("first", "second", "third"):
        v1.create_namespaced_pod(NS, pod(name, "import time; time.sleep(60)"))
    wait_pod(v1, "first", phase("Running"))
    for name in ("second", "third"):
        stuck = wait_pod(v1, name, unschedulable)
        assert stuck.status.phase == "Pending" and "Too many pods" in stuck.status.conditions[0].message
    k8s_api.server.capacity(2)
    running = wait_phases(v1, lambda phases: "Running" in (phases["second"], phases["third"]))
    assert sorted([running["second"], running["third"]]) == ["Pending", "Running"]
    v1.delete_namespaced_pod("first", NS, grace_period_seconds=0)  # its place frees
    wait_phases(v1, lambda phases: phases["second"] == phases["third"] == "Running")


def wait_phases(v1, until, timeout=20):
    """Watch every pod until ``until({name: phase})``; return those phases."""
    phases = {p.metadata.name: p.status.phase for p in v1.list_namespaced_pod(NS).items}
    if until(phases):
        return phases
    w = watch.Watch()
    for event in w.stream(v1.list_namespaced_pod, NS, timeout_seconds=timeout):
        phases[event["object"].metadata.name] = event["object"].status.phase
        if until(phases):
            w.stop()
            return phases
    raise AssertionError(f"pods never reached the expected phases: {phases}")


def test_image_pull_failure(k8s_api, v1):
    k8s_api.server.image_pull_fails("python:3.11-slim")
    v1.create_namespaced_pod(NS, pod("pull"))
    stuck = wait_pod(v1, "pull", lambda p: waiting_reason(p) == "ImagePullBackOff")
    assert stuck.status.phase == "Pending"
    messages = [e.message for e in v1.list_namespaced_event(
        NS, field_selector="involvedObject.name=pull").items]
    assert any(m.startswith('Failed to pull image "python:3.11-slim"') for m in messages)
    assert "Error: ErrImagePull" in messages
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod_log("pull", NS)
    assert "image can't be pulled" in status_body(err.value)["message"]


def test_kill_and_evict(k8s_api, v1):
    for name in ("killed", "evicted"):
        v1.create_namespaced_pod(NS, pod(name, "import time; time.sleep(60)"))
        wait_pod(v1, name, phase("Running"))
    k8s_api.server.kill_pod("killed")
    killed = wait_pod(v1, "killed", phase("Failed"))
    assert killed.status.container_statuses[0].state.terminated.exit_code == 137
    k8s_api.server.evict("evicted")
    evicted = wait_pod(v1, "evicted", phase("Failed"))
    assert evicted.status.reason == "Evicted"


def test_restart_policy_always_restarts(v1):
    v1.create_namespaced_pod(NS, pod("crashy", "raise SystemExit(1)", restart="Always"))
    again = wait_pod(v1, "crashy", lambda p: p.status.container_statuses
                     and p.status.container_statuses[0].restart_count >= 1)
    assert again.status.phase == "Running"
    assert again.status.container_statuses[0].last_state.terminated.exit_code == 1


def test_conflict_not_found_and_validation(k8s_api, v1):
    v1.create_namespaced_pod(NS, pod("dup"))
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, pod("dup"))
    assert (err.value.status, status_body(err.value)["reason"]) == (409, "AlreadyExists")

    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod("absent", NS)
    assert status_body(err.value)["message"] == 'pods "absent" not found'

    no_image = pod("no-image")
    no_image.spec.containers[0].image = None
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod(NS, no_image)
    body = status_body(err.value)
    assert (err.value.status, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"] == [{"reason": "FieldValueRequired",
                                         "message": "Required value",
                                         "field": "spec.containers[0].image"}]

    for bad in (pod("Bad_Name"), pod("ok", labels={"app": "not valid!"}),
                client.V1Pod(metadata=client.V1ObjectMeta(name="empty"),
                             spec=client.V1PodSpec(containers=[]))):
        with pytest.raises(ApiException) as err:
            v1.create_namespaced_pod(NS, bad)
        assert err.value.status == 422, bad

    # kubernetes>=37 checks dicts client-side; older clients send them as they are.
    snake = {"metadata": {"name": "snake"}, "spec": {"restart_policy": "Never", "containers": [
        {"name": "main", "image": "python:3.11-slim"}]}}
    code, body = raw_post(k8s_api, "/api/v1/namespaces/default/pods", snake)
    assert code == 400 and 'unknown field "spec.restart_policy"' in body["message"]
    code, body = raw_post(k8s_api, "/api/v1/namespaces/default/pods",
                          {"metadata": {"name": "typed"}, "spec": {"containers": "main"}})
    assert (code, body["reason"]) == (400, "BadRequest")
    assert "cannot be handled as a Pod" in body["message"]

    generated = v1.create_namespaced_pod(NS, client.V1Pod(
        metadata=client.V1ObjectMeta(generate_name="worker-"), spec=pod("x").spec))
    assert generated.metadata.name.startswith("worker-") and len(generated.metadata.name) == 12


def test_kubeconfig_and_token(k8s_api):
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(k8s_api.kubeconfig_path),
                            client_configuration=configuration)
    v1 = client.CoreV1Api(client.ApiClient(configuration))
    assert v1.list_namespaced_pod(NS).items == []
    anonymous = client.CoreV1Api(client.ApiClient(client.Configuration(host=k8s_api.server.host)))
    with pytest.raises(ApiException) as err:
        anonymous.list_namespaced_pod(NS)
    assert err.value.status == 401
    method, path, body = k8s_api.server.requests[0]
    assert (method, path, body) == ("GET", "/api/v1/namespaces/default/pods", None)
