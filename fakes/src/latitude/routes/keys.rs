//! SSH keys and tags: what a provisioner registers before it creates.

use super::*;

pub(super) async fn list_keys(
    State(shared): State<Arc<Shared>>,
    Query(params): Params,
) -> Response {
    let world = shared.world();
    if let Some(p) = params.get("filter[project]")
        && !world.is_project(p)
    {
        return paged(vec![], &params);
    }
    let items = world.keys.iter().map(|k| world.key_json(k)).collect();
    paged(items, &params)
}

#[derive(Deserialize)]
struct KeyAttributes {
    name: Option<String>,
    public_key: Option<String>,
}

pub(super) async fn create_key(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let a: KeyAttributes = match envelope(&body, "ssh_keys") {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    let (Some(name), Some(public_key)) = (a.name, a.public_key) else {
        return error_with(
            422,
            "VALIDATION_ERROR",
            "Validation Error",
            "name and public_key are required",
            Some("/data/attributes"),
            json!({}),
        );
    };
    let mut world = shared.world();
    let i = world.add_key(name, public_key);
    answer(
        201,
        &json!({ "data": world.key_json(&world.keys[i]), "meta": {} }),
    )
}

pub(super) async fn get_key(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let world = shared.world();
    match world.keys.iter().find(|k| k.id == id) {
        Some(k) => answer(200, &json!({ "data": world.key_json(k), "meta": {} })),
        None => not_found(),
    }
}

#[derive(Deserialize)]
struct KeyUpdate {
    name: Option<String>,
}

pub(super) async fn update_key(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let mut world = shared.world();
    let Some(i) = world.keys.iter().position(|k| k.id == id) else {
        return not_found();
    };
    let a: KeyUpdate = match envelope(&body, "ssh_keys") {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    if let Some(name) = a.name.filter(|n| !n.is_empty()) {
        world.keys[i].name = name;
    }
    answer(
        200,
        &json!({ "data": world.key_json(&world.keys[i]), "meta": {} }),
    )
}

pub(super) async fn delete_key(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Response {
    let mut world = shared.world();
    match world.keys.iter().position(|k| k.id == id) {
        Some(i) => {
            world.keys.remove(i);
            answer(200, &json!({ "meta": {} }))
        }
        None => not_found(),
    }
}

pub(super) async fn list_tags(State(shared): State<Arc<Shared>>) -> Response {
    let world = shared.world();
    let data: Vec<Value> = world.tags.iter().map(|t| world.tag_data_json(t)).collect();
    answer(200, &json!({ "data": data }))
}

#[derive(Deserialize)]
struct TagAttributes {
    name: Option<String>,
    description: Option<String>,
    color: Option<String>,
}

pub(super) async fn create_tag(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let a: TagAttributes = match envelope(&body, "tags") {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    let Some(name) = a.name.filter(|n| !n.is_empty()) else {
        return error_with(
            422,
            "VALIDATION_ERROR",
            "Validation Error",
            "name can't be blank",
            Some("/data/attributes/name"),
            json!({}),
        );
    };
    let mut world = shared.world();
    if world.tags.iter().any(|t| t.name == name) {
        return error_with(
            422,
            "NAME_ALREADY_TAKEN",
            "Validation Error",
            "name is already taken",
            Some("/data/attributes/name"),
            json!({}),
        );
    }
    let color = a.color.unwrap_or_else(|| "#ffffff".into());
    let i = world.add_tag(name, a.description, color);
    answer(201, &json!({ "data": world.tag_data_json(&world.tags[i]) }))
}
