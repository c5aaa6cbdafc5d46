"""The daemon's MQTT output: the publisher, its queue (in memory and on disk), paho's quirks,
the per-camera topics, Home Assistant discovery and sensors, the publish policy and commands."""
