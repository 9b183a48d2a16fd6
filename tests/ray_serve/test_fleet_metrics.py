"""The pure parts of the Serve application's `/metrics` (replica ids from actor names, merging pages with
per-replica labels) and of its OpenAI routes (generate paths). No cluster needed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from headroom.ray_serve.fleet_metrics import merge_pages, replica_ids
from headroom.ray_serve.openai_ingress import generate_path


def _page(requests: int, running: int) -> str:
    registry = CollectorRegistry()
    Counter("headroom_requests", "Requests.", ["model"], registry=registry).labels("m").inc(requests)
    Gauge("headroom_llm_num_requests_running", "Running.", registry=registry).set(running)
    return generate_latest(registry).decode()


def test_replica_ids_are_those_of_the_deployment_in_the_app() -> None:
    names = ["SERVE_REPLICA::headroom#headroom-llm#abc", "SERVE_REPLICA::headroom#headroom-models#x1",
             "SERVE_REPLICA::other#headroom-llm#zzz", "SERVE_CONTROLLER_ACTOR", "SERVE_REPLICA::headroom#headroom-llm#"]
    assert replica_ids(names, "headroom", "headroom-llm") == ["abc"]
    assert replica_ids(names, "headroom", "headroom-models") == ["x1"]


def test_pages_merge_into_one_family_per_name_labelled_per_replica() -> None:
    families = merge_pages([("headroom-llm", "a", _page(3, 1)), ("headroom-llm", "b", _page(5, 0)),
                            ("headroom-models", "c", "this is { not a page")])  # skipped, not fatal
    registry = CollectorRegistry()

    class Fixed:
        def collect(self):  # type: ignore[no-untyped-def]
            return iter(families.values())

    registry.register(Fixed())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert text.count("# TYPE headroom_requests_total counter") == 1  # one family, however many replicas
    samples = {(s.name, s.labels.get("replica")): s.value for f in text_string_to_metric_families(text)
               for s in f.samples}
    assert samples[("headroom_requests_total", "a")] == 3 and samples[("headroom_requests_total", "b")] == 5
    assert samples[("headroom_llm_num_requests_running", "a")] == 1
    assert all(s.labels["deployment"] == "headroom-llm" for f in text_string_to_metric_families(text)
               for s in f.samples)


def test_generate_paths() -> None:
    assert generate_path("/v2/models/smollm2/generate") == "smollm2"
    assert generate_path("/v2/models/smollm2/generate_stream") == "smollm2"
    assert generate_path("/v2/models/smollm2/versions/1/generate") == "smollm2"
    for other in ("/v2/models/smollm2/infer", "/v2/models//generate", "/v2/generate", "/v1/models/x/generate",
                  "/v2/models/a/b/generate", "/v2/models/a/versions//generate"):
        assert generate_path(other) is None, other
