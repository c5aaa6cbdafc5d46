"""The [mqtt] publishing keys of the serve configuration: values, combinations and files."""

from __future__ import annotations

import dataclasses

import pytest

from edgekit.errors import UsageError
from edgekit.serve.config.load import from_dict
from edgekit.serve.mqtt.from_config import mqtt_from_config


def config(**mqtt):
    return from_dict({"model": {"path": "m.tflite"}, "mqtt": {"host": "127.0.0.1", **mqtt}}, where="serve.toml")


def test_defaults_publish_on_change_with_a_bounded_queue():
    m = config().mqtt
    assert (m.publish, m.min_score, m.confirm_frames, m.queue_size, m.queue_policy, m.tls, m.discovery) == (
        "change", 0.5, 2, 1000, "drop_oldest", False, False)


@pytest.mark.parametrize("values, message", [
    ({"publish": "sometimes"}, "publish = 'sometimes' is not one of"),
    ({"queue_policy": "drop_all"}, "queue_policy"),
    ({"queue_size": -1}, "below the minimum 0"),
    ({"min_score": 1.5}, "min_score is a score"),
    ({"confirm_frames": 0}, "below the minimum 1"),
    ({"labels_of_interest": "cat"}, "must be a list of strings"),
    ({"labels_of_interest": ["cat", 3]}, "must be a list of strings"),
    ({"ca_file": "ca.crt"}, "tls is false"),
    ({"tls": True, "key_file": "k.pem"}, "key_file without cert_file"),
    ({"tls": True, "ca_file": "missing-ca.crt"}, "ca_file"),
    ({"password_file": "missing.pass"}, "password_file"),
])
def test_bad_values_are_one_clear_error(values, message):
    with pytest.raises(UsageError, match=message) as info:
        config(**values)
    assert "serve.toml" in info.value.message and info.value.hint


def test_labels_of_interest_and_files_relative_to_the_config(tmp_path):
    (tmp_path / "ca.crt").write_text("x")
    (tmp_path / "serve.toml").write_text(
        '[model]\npath = "m.tflite"\n[mqtt]\nhost = "broker"\ntls = true\nca_file = "ca.crt"\n'
        'labels_of_interest = ["cat", "dog"]\ndiscovery = true\npublish = "interval"\nmin_interval_s = 2\n')
    from edgekit.serve.config.load import load_config

    c = load_config(tmp_path / "serve.toml")
    assert c.mqtt.ca_file == str(tmp_path / "ca.crt") and c.mqtt.labels_of_interest == ("cat", "dog")
    pytest.importorskip("paho.mqtt.client")
    with pytest.raises(UsageError, match="no certificate") as info:  # "x" is no CA certificate
        mqtt_from_config(c)
    assert "ca_file" in info.value.hint
    pub = mqtt_from_config(dataclasses.replace(c, mqtt=dataclasses.replace(c.mqtt, ca_file="")))
    assert pub.policy.mode == "interval" and pub.policy.min_interval_s == 2.0
    assert pub.address == "mqtts://broker:1883" and pub.options.device == c.device


def test_the_password_is_read_from_its_file_and_kept_out_of_stats(tmp_path):
    pytest.importorskip("paho.mqtt.client")
    (tmp_path / "pass").write_text("hunter2\n")
    pub = mqtt_from_config(config(username="u", password_file=str(tmp_path / "pass")))
    assert "hunter2" not in repr(pub.stats()) and "hunter2" not in repr(pub.options)
