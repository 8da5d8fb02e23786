"""`fastdeploy router`: one OpenAI-compatible endpoint in front of many `fastdeploy serve` workers.

It speaks only HTTP to its workers (it loads no model and imports no engine): requests are sent to
a worker chosen by a policy (policies.py), streams are relayed event by event as they arrive
(proxy.py), workers that fail their health check are left out until they recover (workers.py),
and /metrics joins the router's counters with every worker's metrics (metrics.py).
"""
