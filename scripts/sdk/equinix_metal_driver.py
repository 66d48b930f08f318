"""equinix-metal (the generated Equinix Metal SDK) against the fake Metal
API. Environment: METAL_URL (http://HOST:PORT/metal/v1), METAL_AUTH_TOKEN,
METAL_PROJECT_ID."""

import os
import time

import equinix_metal as em
from equinix_metal.exceptions import NotFoundException
from common import Steps, need, record

project_id = os.environ["METAL_PROJECT_ID"]
config = em.Configuration(host=os.environ["METAL_URL"])
config.api_key["x_auth_token"] = os.environ["METAL_AUTH_TOKEN"]
client = em.ApiClient(config)

# Record every exchange (the SDK's deserialisation errors do not say which
# answer they came from).
_request = client.rest_client.request
def _recorded(method, url, *args, **kwargs):
    resp = _request(method, url, *args, **kwargs)
    record(method, url, resp.status, resp.read())
    return resp
client.rest_client.request = _recorded

projects = em.ProjectsApi(client)
reservations_api = em.HardwareReservationsApi(client)
devices = em.DevicesApi(client)
keys = em.SSHKeysApi(client)
steps = Steps("equinix-metal")
suffix = str(int(time.time() * 1000))[-8:]


def get_project():
    p = projects.find_project_by_id(project_id)
    need(str(p.id) == project_id, f"project id {p.id!r}")

steps.run("FindProjectById", get_project)


def list_reservations():
    # include=facility: the metro the create needs is in the facility.
    rl = reservations_api.find_project_hardware_reservations(project_id, include=["facility"], per_page=100)
    free = [r for r in rl.hardware_reservations if r.provisionable and r.device is None]
    need(free, "no provisionable reservation")
    r = free[0]
    return str(r.id), r.plan.slug, r.facility.metro.code

target = steps.run("FindProjectHardwareReservations", list_reservations)


def list_reservations_all_pages():
    rl = reservations_api.find_project_hardware_reservations_all_pages(project_id, per_page=7)
    need(len(rl.hardware_reservations) >= 8, f"only {len(rl.hardware_reservations)} across pages")

steps.run("FindProjectHardwareReservations(all pages)", list_reservations_all_pages)
steps.run("FindProjectDevices", lambda: devices.find_project_devices(project_id))

PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEquinixMetalSdkCheck%s sdk-check" % suffix
user_key = steps.run("CreateSSHKey", lambda: keys.create_ssh_key(
    em.SSHKeyCreateInput(label="sdk-check-user-" + suffix, key=PUBKEY + "u")))
project_key = steps.run("CreateProjectSSHKey", lambda: keys.create_project_ssh_key(
    project_id, em.SSHKeyCreateInput(label="sdk-check-project-" + suffix, key=PUBKEY + "p")))


def get_key():
    k = keys.find_ssh_key_by_id(str(user_key.id))
    need(k.key == PUBKEY + "u", f"key {k.key!r}")

steps.run("FindSSHKeyById", get_key, user_key)
steps.run("FindSSHKeys", lambda: need(any(k.id == user_key.id for k in keys.find_ssh_keys().ssh_keys), "user key not listed"), user_key)
steps.run("FindProjectSSHKeys", lambda: need(any(k.id == project_key.id for k in keys.find_project_ssh_keys(project_id).ssh_keys), "project key not listed"), project_key)

hostname = "sdk-em-" + suffix


def create_device():
    res_id, plan, metro = target
    body = em.CreateDeviceRequest(em.DeviceCreateInMetroInput(
        metro=metro, plan=plan, operating_system="ubuntu_22_04", hostname=hostname,
        hardware_reservation_id=res_id, tags=["sdk-check", "equinix-metal"],
        project_ssh_keys=[str(project_key.id)] if project_key else None))
    d = devices.create_device(project_id, body)
    need(d.hostname == hostname, f"hostname {d.hostname!r}")
    return d

device = steps.run("CreateDevice", create_device, target)


def get_device():
    d = devices.find_device_by_id(str(device.id))
    need(d.id == device.id and "sdk-check" in (d.tags or []), f"device {d.id!r} tags {d.tags!r}")

steps.run("FindDeviceById", get_device, device)


def update_device():
    d = devices.update_device(str(device.id), em.DeviceUpdateInput(
        hostname=hostname + "-renamed", tags=["sdk-check", "updated"]))
    need(d.hostname == hostname + "-renamed" and "updated" in d.tags, f"after update {d.hostname!r} {d.tags!r}")

steps.run("UpdateDevice", update_device, device)


def list_by_hostname():
    dl = devices.find_project_devices(project_id, hostname=hostname + "-renamed")
    need([d.id for d in dl.devices] == [device.id], f"listed {[d.id for d in dl.devices]!r}")

steps.run("FindProjectDevices(hostname)", list_by_hostname, device)


def list_all_pages():
    dl = devices.find_project_devices_all_pages(project_id, per_page=1)
    need(device.id in [d.id for d in dl.devices], "device missing across pages")

steps.run("FindProjectDevices(all pages)", list_all_pages, device)
steps.run("DeleteDevice", lambda: devices.delete_device(str(device.id)), device)


def gone():
    try:
        devices.find_device_by_id(str(device.id))
    except NotFoundException:
        return
    raise AssertionError("device still readable after delete")

steps.run("FindDeviceById(after delete: 404)", gone, device)
steps.run("DeleteSSHKey", lambda: [keys.delete_ssh_key(str(k.id)) for k in (user_key, project_key) if k])
steps.finish()
