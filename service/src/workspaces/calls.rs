//! The service's calls on workspaces, as a caller makes them: within its quotas.

use super::{WorkspaceRequest, Workspaces};
use crate::error::ApiResult;
use crate::wire::workspaces::{WorkspaceList, WorkspaceView};

impl crate::state::Service {
    fn workspaces(&self) -> ApiResult<&Workspaces> {
        Ok(&self.sandbox_api()?.workspaces)
    }

    /// `POST /v1/workspaces`: its whole size within the caller's disk quota.
    pub fn create_workspace(&self, who: &crate::tenancy::Who, request: WorkspaceRequest) -> ApiResult<WorkspaceView> {
        let quotas = &who.profile.quotas;
        if quotas.get(tenants::Quota::DiskMib).is_some() {
            let used = self.disk_usage(who.tenant()) >> 20;
            quotas
                .check(tenants::Quota::DiskMib, used, request.size_mib.max(1))
                .map_err(|e| crate::tenancy::over_quota(who, e))?;
        }
        self.workspaces()?.create(who.tenant(), request)
    }

    pub fn workspace(&self, who: &crate::tenancy::Who, name: &str) -> ApiResult<WorkspaceView> {
        self.workspaces()?.get(who.tenant(), name)
    }

    pub fn list_workspaces(&self, who: &crate::tenancy::Who) -> ApiResult<WorkspaceList> {
        self.workspaces()?.list(who.tenant())
    }

    pub fn delete_workspace(&self, who: &crate::tenancy::Who, name: &str) -> ApiResult<()> {
        self.workspaces()?.delete(who.tenant(), name)
    }

    pub fn fence_workspace(&self, who: &crate::tenancy::Who, name: &str) -> ApiResult<WorkspaceView> {
        self.workspaces()?.fence(who.tenant(), name)
    }
}
