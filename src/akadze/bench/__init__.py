"""The harness: what measures and proves akadze, never what runs it.

- the benchmarks behind ``akadze bench ...`` (``claims``, ``enqueue``, ``throughput``,
  ``faults``, ``soak``), each writing an optional Markdown report;
- the fault scenarios and their audit (``fault_*``), run by ``akadze bench faults``
  and ``soak`` and by the reliability tests;
- the demo behind ``akadze demo`` (:mod:`akadze.bench.demo`, its plan and checks in
  :mod:`akadze.bench.demo_plan`);
- the latency-injecting TCP proxy (:mod:`akadze.bench.proxy`): an injected round
  trip, and a partition (pause, resume) or a reset (cut), for benches and scenarios;
- the watch: the test-only trigger that checks ``max_running`` at every claim
  commit, shared by the claim bench, the fault scenarios and the tests.

Their SQL lives here, in ``bench/sql/*.sql``, loaded by :mod:`akadze.bench.queries`
(the runtime's loader over this folder): none of it is in the runtime's query
namespace, and the runtime imports nothing from this package.
"""
