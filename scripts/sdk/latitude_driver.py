"""latitudesh-python-sdk (Latitude.sh's official SDK) against the fake
Latitude API. Environment: LATITUDE_URL (http://HOST:PORT), LATITUDE_API_KEY,
LATITUDE_PROJECT."""

import os
import time

import httpx
from latitudesh_python_sdk import Latitudesh, models
from common import Steps, need, record

project = os.environ["LATITUDE_PROJECT"]


# Record every exchange: the SDK's validation errors do not name the answer.
def _log(resp):
    resp.read()
    record(resp.request.method, str(resp.request.url), resp.status_code, resp.text)

http = httpx.Client(follow_redirects=True, event_hooks={"response": [_log]})
sdk = Latitudesh(bearer=os.environ["LATITUDE_API_KEY"], server_url=os.environ["LATITUDE_URL"], client=http)
steps = Steps("latitudesh-python-sdk")
suffix = str(int(time.time() * 1000))[-8:]
PLAN, SITE, OS = "c2-small-x86", "DAL", "ubuntu_24_04_x64_lts"


def list_plans():
    plans = sdk.plans.list()
    need(any(p.attributes.slug == PLAN for p in plans.data), "plan missing")

steps.run("plans.list", list_plans)
steps.run("plans.list(filter_slug, filter_in_stock)", lambda: need(
    [p.attributes.slug for p in sdk.plans.list(filter_slug=PLAN, filter_in_stock=True).data] == [PLAN], "filter"))


def list_servers():
    page = sdk.servers.list(filter_project=project, page_size=20, page_number=1, stats_total="count")
    need(page is not None, "no answer")
    return page.result.data

steps.run("servers.list(filter_project, page_size, page_number, stats_total)", list_servers)

PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILatitudeSdkCheck%s sdk-check" % suffix


def create_key():
    k = sdk.ssh_keys.post_ssh_key(data={"type": "ssh_keys", "attributes": {
        "name": "sdk-check-" + suffix, "public_key": PUBKEY, "project": project}})
    need(k.data and k.data.id, "no id")
    return k.data

key = steps.run("ssh_keys.post_ssh_key", create_key)
steps.run("ssh_keys.get_ssh_keys(filter_project)", lambda: need(
    any(k.id == key.id for k in sdk.ssh_keys.get_ssh_keys(filter_project=project).data), "key not listed"), key)
steps.run("ssh_keys.get_ssh_key", lambda: need(
    sdk.ssh_keys.get_ssh_key(ssh_key_id=key.id).data.attributes.public_key == PUBKEY, "public_key"), key)


def create_tag():
    t = sdk.tags.create(data={"type": "tags", "attributes": {"name": "sdk-check-" + suffix, "color": "#00ff00"}})
    need(t.data and t.data.id, "no id")
    return t.data.id

tag = steps.run("tags.create", create_tag)
hostname = "sdk-lat-" + suffix


def create_server():
    s = sdk.servers.create(data={"type": "servers", "attributes": {
        "project": project, "plan": PLAN, "site": SITE, "operating_system": OS,
        "hostname": hostname, "ssh_keys": [key.id] if key else None}})
    need(s.data and s.data.id and s.data.attributes.hostname == hostname, f"server {s.data!r}")
    return s.data.id

server = steps.run("servers.create", create_server)


def get_server():
    s = sdk.servers.get(server_id=server)
    need(s.data.id == server and s.data.attributes.hostname == hostname, f"server {s.data!r}")

steps.run("servers.get", get_server, server)


def list_by_hostname():
    page = sdk.servers.list(filter_hostname=hostname)
    need([s.id for s in page.result.data] == [server], f"listed {[s.id for s in page.result.data]!r}")

steps.run("servers.list(filter_hostname)", list_by_hostname, server)


def list_pages():
    # page_size=1 so that the SDK's .next() has to ask for page 2.
    page, seen = sdk.servers.list(filter_project=project, page_size=1), []
    while page is not None:
        seen += [s.id for s in page.result.data]
        page = page.next()
    need(server in seen, f"not found across pages: {seen!r}")

steps.run("servers.list(page_size=1) + next()", list_pages, server)


def update_server():
    s = sdk.servers.update(server_id=server, data={"id": server, "type": "servers", "attributes": {
        "hostname": hostname + "-renamed", "tags": [tag] if tag else None}})
    need(s.data.attributes.hostname == hostname + "-renamed", f"hostname {s.data.attributes.hostname!r}")
    got = [t.id for t in (sdk.servers.get(server_id=server).data.attributes.tags or [])]
    need(tag is None or got == [tag], f"tags after update {got!r}")

steps.run("servers.update(hostname, tags)", update_server, server)
steps.run("servers.delete", lambda: sdk.servers.delete(server_id=server), server)


def gone():
    try:
        sdk.servers.get(server_id=server)
    except models.LatitudeshError as e:
        need(e.status_code == 404, f"status {e.status_code}")
        return
    raise AssertionError("server still readable after delete")

steps.run("servers.get(after delete: 404)", gone, server)
steps.run("ssh_keys.delete_ssh_key", lambda: sdk.ssh_keys.delete_ssh_key(ssh_key_id=key.id), key)
steps.finish()
