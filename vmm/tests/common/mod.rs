//! Shared set-up for integration tests that boot real guests: one runtime per test binary,
//! one booted machine per image, shared by every test that only runs commands.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::Duration;

use vmm::{AccelSetting, GuestArtifacts, Machine, VmSettings};

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

pub fn artifacts(image: &str) -> GuestArtifacts {
    GuestArtifacts::locate(&vmm::artifacts::cache_dir(), image)
        .unwrap_or_else(|e| panic!("integration tests need the guest artifacts: {e}"))
}

pub fn settings() -> VmSettings {
    let mut settings = VmSettings::detect(AccelSetting::Auto).expect("QEMU must be installed (scripts/setup.sh)");
    // Generous: tests share two cores with other tests booting guests under TCG.
    settings.boot_timeout = Duration::from_secs(180);
    settings
}

pub async fn boot(image: &str) -> Machine {
    let a = artifacts(image);
    Machine::boot(&settings(), &a.kernel.path, &a.image.path)
        .await
        .unwrap_or_else(|e| panic!("booting {image}: {e}"))
}

/// A minimal-image machine shared by the tests of this binary (killed with the process).
pub async fn shared_minimal() -> &'static Machine {
    static MACHINE: tokio::sync::OnceCell<Machine> = tokio::sync::OnceCell::const_new();
    MACHINE.get_or_init(|| boot("minimal")).await
}

pub async fn shared_python() -> &'static Machine {
    static MACHINE: tokio::sync::OnceCell<Machine> = tokio::sync::OnceCell::const_new();
    MACHINE.get_or_init(|| boot("python")).await
}
