"""Tests of state_engine.flink on real Flink 2.3 snapshots."""
