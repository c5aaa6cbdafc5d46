"""Host-side .tflite tooling: the flatbuffer graph reader and the offline Edge TPU rules."""
