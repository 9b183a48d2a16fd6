"""Tests of headroom.llm."""
