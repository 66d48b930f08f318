"""packet-python (the old official Equinix Metal SDK) against the fake Metal
API. Environment: METAL_URL (http://HOST:PORT/metal/v1), METAL_AUTH_TOKEN,
METAL_PROJECT_ID."""

import os
import time
import types

import requests

import packet
import packet.baseapi
from common import Steps, need, record

url = os.environ["METAL_URL"]
project_id = os.environ["METAL_PROJECT_ID"]
scheme, rest = url.split("://", 1)

# packet-python hard-codes `"https://" + end_point + "/" + path`
# (baseapi.py, BaseAPI.call_api), so a plain-HTTP fake can only be reached by
# rewriting the scheme under it. This shim changes nothing else, and it also
# records each exchange for the failure messages.
def _via(verb):
    def send(target, **kw):
        if scheme == "http" and target.startswith("https://"):
            target = "http://" + target[len("https://"):]
        resp = getattr(requests, verb)(target, **kw)
        record(verb.upper(), target, resp.status_code, resp.text)
        return resp
    return send

packet.baseapi.requests = types.SimpleNamespace(
    get=_via("get"), post=_via("post"), patch=_via("patch"), delete=_via("delete"),
    exceptions=requests.exceptions, utils=requests.utils, HTTPError=requests.HTTPError,
)

manager = packet.Manager(auth_token=os.environ["METAL_AUTH_TOKEN"])
manager.end_point = rest  # HOST:PORT/metal/v1: paths are relative to it
steps = Steps("packet-python")
suffix = str(int(time.time() * 1000))[-8:]


def get_project():
    p = manager.get_project(project_id)
    need(p.id == project_id, f"project id {p.id!r}")
    return p

steps.run("get_project", get_project)


def list_reservations():
    # include=facility, so the metro needed for the create is in the answer.
    rs = manager.list_hardware_reservations(project_id, params={"include": "facility", "per_page": 100})
    need(rs, "no reservations")
    return rs

reservations = steps.run("list_hardware_reservations", list_reservations)
if reservations:
    free = [r for r in reservations if r.provisionable and not r.device]
    target = (free[0].id, free[0].plan.slug, None) if free else None
    # HardwareReservation drops `facility`, so the metro comes from a GET.
else:
    target = None
if target is None:
    # Fallback so that the later steps still run: the same listing, read
    # raw through packet-python's own call_api.
    raw = manager.call_api(f"projects/{project_id}/hardware-reservations",
                           params={"include": "facility", "per_page": 100})
    r = next(r for r in raw["hardware_reservations"] if r["provisionable"] and "device" not in r)
    target = (r["id"], r["plan"]["slug"], r["facility"]["metro"]["code"])
res_id, plan_slug, metro = target
if metro is None:
    metro = manager.call_api(f"hardware-reservations/{res_id}", params={"include": "facility"})["facility"]["metro"]["code"]

steps.run("list_devices", lambda: manager.list_devices(project_id))

PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPacketPythonSdkCheck%s sdk-check" % suffix

user_key = steps.run("create_ssh_key", lambda: manager.create_ssh_key("sdk-check-user-" + suffix, PUBKEY + "u"))
project_key = steps.run(
    "create_project_ssh_key",
    lambda: manager.create_project_ssh_key(project_id, "sdk-check-project-" + suffix, PUBKEY + "p"))


def get_key():
    k = manager.get_ssh_key(user_key.id)
    need(k.key == PUBKEY + "u", f"key {k.key!r}")

steps.run("get_ssh_key", get_key, user_key)

hostname = "sdk-packet-" + suffix


def create_device():
    d = manager.create_device(
        project_id, hostname, plan_slug, metro=metro, operating_system="ubuntu_22_04",
        hardware_reservation_id=res_id, tags=["sdk-check", "packet-python"],
        project_ssh_keys=[project_key.id] if project_key else [])
    need(d.hostname == hostname and d.state == "queued", f"device {d.hostname!r} {d.state!r}")
    return d

device = steps.run("create_device", create_device)


def get_device():
    d = manager.get_device(device.id)
    need(d.id == device.id and "sdk-check" in (d.tags or []), f"device {d.id!r} tags {d.tags!r}")
    return d

fetched = steps.run("get_device", get_device, device)


def update_device():
    fetched.hostname = hostname + "-renamed"
    fetched.tags = (fetched.tags or []) + ["updated"]
    fetched.update()
    d = manager.get_device(device.id)
    need(d.hostname == hostname + "-renamed" and "updated" in d.tags, f"after update {d.hostname!r} {d.tags!r}")

steps.run("update_device", update_device, fetched)


def list_project_devices():
    ds = manager.list_devices(project_id, params={"hostname": hostname + "-renamed"})
    need([d.id for d in ds] == [device.id], f"listed {[d.id for d in ds]!r}")

steps.run("list_devices_by_hostname", list_project_devices, device)


def list_all():
    ds = manager.list_all_devices(project_id)
    need(device.id in [d.id for d in ds], "device missing from list_all_devices")

steps.run("list_all_devices", list_all, device)
steps.run("delete_device", lambda: device.delete(), device)


def gone():
    try:
        manager.get_device(device.id)
    except packet.baseapi.ResponseError as e:
        need(e.response.status_code == 404, f"status {e.response.status_code}")
        return
    raise AssertionError("device still readable after delete")

steps.run("device_gone_after_delete", gone, device)
steps.run("delete_ssh_keys", lambda: [k.delete() for k in (user_key, project_key) if k])
steps.finish()
