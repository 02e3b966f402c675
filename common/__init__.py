"""Shared vocabulary of rqrl: config, Redis keys, connections, serialisation, streams, policies."""
