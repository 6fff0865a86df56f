//! OCI image layouts built from files the test makes: layer tars (with
//! whiteouts, raw names for escape tests), gzip, the layout's index, and the
//! host's `sh` with its libraries as an image's content.
#![allow(dead_code)] // each test crate uses a part

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

pub enum Item {
    File(String, Vec<u8>, u32),
    Dir(String),
    Symlink(String, String),
    /// A regular file whose raw name is written unchecked (for escape tests).
    RawName(String, Vec<u8>),
}

pub fn file(path: &str, data: &[u8]) -> Item {
    Item::File(path.into(), data.to_vec(), 0o644)
}

pub fn layer_tar(items: &[Item]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for item in items {
        let mut h = tar::Header::new_gnu();
        match item {
            Item::File(path, data, mode) => {
                h.set_size(data.len() as u64);
                h.set_mode(*mode);
                h.set_entry_type(tar::EntryType::Regular);
                b.append_data(&mut h, path, data.as_slice()).expect("tar file");
            }
            Item::Dir(path) => {
                h.set_size(0);
                h.set_mode(0o755);
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, path, std::io::empty()).expect("tar dir");
            }
            Item::Symlink(path, target) => {
                h.set_size(0);
                h.set_mode(0o777);
                h.set_entry_type(tar::EntryType::Symlink);
                b.append_link(&mut h, path, target).expect("tar symlink");
            }
            Item::RawName(name, data) => {
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_entry_type(tar::EntryType::Regular);
                let raw = &mut h.as_old_mut().name;
                raw[..name.len()].copy_from_slice(name.as_bytes());
                h.set_cksum();
                b.append(&h, data.as_slice()).expect("tar raw");
            }
        }
    }
    b.into_inner().expect("tar")
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

/// Writes an OCI layout with the given layers (already encoded) and config.
pub fn write_layout(dir: &Path, layers: &[(Vec<u8>, &str)], config: serde_json::Value, ref_name: &str) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs");
    let put = |bytes: &[u8]| {
        let d = sha(bytes);
        std::fs::write(blobs.join(&d), bytes).expect("blob");
        (format!("sha256:{d}"), bytes.len())
    };
    let config_bytes = serde_json::to_vec(&config).expect("config");
    let (cdigest, csize) = put(&config_bytes);
    let layer_descs: Vec<serde_json::Value> = layers
        .iter()
        .map(|(bytes, mt)| {
            let (d, s) = put(bytes);
            serde_json::json!({"mediaType": mt, "digest": d, "size": s})
        })
        .collect();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
        "layers": layer_descs,
    });
    let (mdigest, msize) = put(&serde_json::to_vec(&manifest).expect("manifest"));
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": msize,
                        "annotations": {"org.opencontainers.image.ref.name": ref_name}}],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).expect("index")).expect("index");
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).expect("oci-layout");
}

/// dash and the libraries it links, as image layer entries.
pub fn shell_files() -> Vec<Item> {
    let sh = std::fs::canonicalize("/bin/sh").expect("/bin/sh");
    let out = std::process::Command::new("ldd").arg(&sh).output().expect("ldd");
    let mut paths = vec![sh.clone()];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let p = line.split("=>").last().unwrap_or("").split_whitespace().next().unwrap_or("");
        if p.starts_with('/') {
            paths.push(PathBuf::from(p));
        }
    }
    let mut items: Vec<Item> = paths
        .iter()
        .map(|p| {
            let inside = p.to_string_lossy().trim_start_matches('/').to_string();
            Item::File(inside, std::fs::read(p).expect("read lib"), 0o755)
        })
        .collect();
    items.push(Item::File("bin/sh".into(), std::fs::read(&sh).expect("sh"), 0o755));
    items
}
