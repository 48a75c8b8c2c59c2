//! The one place where errors of the modules below become gRPC statuses. Each error keeps its
//! context (the field, image, layer or path it concerns) in the message; the code says what
//! kind of failure it is so clients can tell bad input from a missing object from an outage.

use tonic::{Code, Status};

use crate::{container, content, image, network, pod, sandbox, snapshot};

/// Errors that can answer an RPC.
pub trait ToStatus: std::error::Error {
    fn code(&self) -> Code;

    fn to_status(&self) -> Status
    where
        Self: Sized,
    {
        Status::new(self.code(), chain(self))
    }
}

/// The error with its causes, `outer: inner: innermost`, without repeating a cause that the
/// outer message already quotes.
pub fn chain(e: &(dyn std::error::Error + '_)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

impl ToStatus for image::Error {
    fn code(&self) -> Code {
        use image::Error as E;
        match self {
            E::Reference(_) | E::Credentials(_) => Code::InvalidArgument,
            E::NotFound { .. } | E::RegistryNotFound { .. } => Code::NotFound,
            E::InUse { .. } => Code::FailedPrecondition,
            E::Unauthorized { .. } => Code::Unauthenticated,
            E::Http { .. } | E::Registry { .. } | E::Download { .. } | E::Network { .. } => {
                Code::Unavailable
            }
            E::HostsConfig { .. }
            | E::AuthFile { .. }
            | E::CredentialHelper { .. }
            | E::Policy { .. }
            | E::PolicyFile { .. } => Code::FailedPrecondition,
            E::Manifest { .. } | E::NoPlatform { .. } | E::Unpack { .. } => {
                Code::FailedPrecondition
            }
            E::DigestMismatch { .. } | E::SizeMismatch { .. } | E::DiffIdMismatch { .. } => {
                Code::DataLoss
            }
            E::Content(c) => c.code(),
            E::Snapshot(s) => s.code(),
            E::Io { .. } => Code::Internal,
        }
    }
}

impl ToStatus for content::Error {
    fn code(&self) -> Code {
        use content::Error as E;
        match self {
            E::InvalidDigest { .. } => Code::InvalidArgument,
            E::SizeMismatch { .. } | E::DigestMismatch { .. } => Code::DataLoss,
            E::NotFound { .. } => Code::NotFound,
            E::Io { .. } => Code::Internal,
        }
    }
}

impl ToStatus for snapshot::Error {
    fn code(&self) -> Code {
        match self {
            snapshot::Error::Missing { .. } => Code::NotFound,
            snapshot::Error::Io { .. } => Code::Internal,
        }
    }
}

/// A required request field that is missing or empty.
pub fn missing(field: &str) -> Status {
    Status::invalid_argument(format!("{field} is required"))
}

impl ToStatus for sandbox::Error {
    fn code(&self) -> Code {
        use sandbox::Error as E;
        match self {
            E::Invalid { .. } | E::Ambiguous { .. } | E::UnknownHandler { .. } => {
                Code::InvalidArgument
            }
            E::NotFound { .. } => Code::NotFound,
            E::NameReserved { .. } => Code::AlreadyExists,
            E::NotReady { .. } | E::Unenforceable { .. } | E::StateUnreachable { .. } => {
                Code::FailedPrecondition
            }
            E::Pause { .. } | E::Io { .. } | E::Cgroup { .. } | E::Systemd(_) => Code::Internal,
            E::Dial { .. } => Code::Unavailable,
        }
    }
}

impl ToStatus for container::Error {
    fn code(&self) -> Code {
        use container::Error as E;
        match self {
            E::Invalid { .. } | E::Ambiguous { .. } => Code::InvalidArgument,
            E::NotFound { .. } | E::ImageNotFound { .. } => Code::NotFound,
            E::NameReserved { .. } => Code::AlreadyExists,
            E::WrongState { .. }
            | E::CheckpointRefused { .. }
            | E::RestoreOff { .. }
            | E::PodRestoreRefused { .. }
            | E::NoCriu { .. }
            | E::NoDeviceControl { .. } => Code::FailedPrecondition,
            E::BadArchive { .. } | E::BadPodCheckpoint { .. } => Code::InvalidArgument,
            E::DeadlinePassed { .. } => Code::DeadlineExceeded,
            E::DevicesCgroup { .. } => Code::Internal,
            E::Checkpoint { .. } => Code::Unknown,
            E::ExecTimeout { .. } => Code::DeadlineExceeded,
            // A process in the kernel's hold (uninterruptible sleep): the caller retries.
            E::Unkillable { .. } => Code::Unavailable,
            E::Start { .. } | E::Exec { .. } | E::Attach { .. } | E::Io { .. } => Code::Internal,
            E::Sandbox(e) => e.code(),
            E::Image(e) => e.code(),
            E::Nri(e) => e.code(),
        }
    }
}

impl ToStatus for crate::nri::Error {
    fn code(&self) -> Code {
        use crate::nri::Error as E;
        match self {
            // A plugin's own failure, passed on as containerd passes it on.
            E::Plugin { .. } => Code::Unknown,
            E::Adjustment(_) => Code::FailedPrecondition,
            E::Rejected { .. } => Code::PermissionDenied,
        }
    }
}

impl ToStatus for pod::Error {
    fn code(&self) -> Code {
        match self {
            pod::Error::Sandbox(e) => e.code(),
            pod::Error::Container(e) => e.code(),
            pod::Error::Restoring { source, .. } => source.code(),
            pod::Error::Image(e) => e.code(),
            pod::Error::Network { source, .. } => source.code(),
            pod::Error::Nri(e) => e.code(),
        }
    }
}

impl ToStatus for network::Error {
    fn code(&self) -> Code {
        match self {
            network::Error::Conf(_) => Code::FailedPrecondition,
            network::Error::Annotation { .. } => Code::InvalidArgument,
            network::Error::Plugin(_) | network::Error::Io { .. } => Code::Internal,
        }
    }
}

impl ToStatus for container::events::Ended {
    fn code(&self) -> Code {
        match self {
            // kubelet relists and subscribes again.
            container::events::Ended::TooSlow(_) => Code::ResourceExhausted,
            container::events::Ended::Closed => Code::Unavailable,
        }
    }
}

impl ToStatus for crate::stream::Error {
    fn code(&self) -> Code {
        match self {
            crate::stream::Error::TooManyWaiting => Code::ResourceExhausted,
            _ => Code::Internal,
        }
    }
}

macro_rules! into_status {
    ($($t:ty),*) => {
        $(impl From<$t> for Status {
            fn from(e: $t) -> Status {
                e.to_status()
            }
        })*
    };
}

into_status!(
    image::Error,
    sandbox::Error,
    container::Error,
    pod::Error,
    crate::stream::Error
);
