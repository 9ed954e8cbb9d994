"""Monitoring: the exporter's metric names (:mod:`names`), the alert rules (:mod:`rules`, one
definition), their Prometheus file (:mod:`prometheus_rules`), the in-process evaluator
(:mod:`evaluator`), the exporter (:mod:`exporter`, needs prometheus-client) and the terminal
dashboard (:mod:`dashboard`). Only the exporter imports torch-side code."""
