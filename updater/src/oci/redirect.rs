//! The blob's redirects, checked here because the client follows none:
//! each `Location` resolved against the current URL, https only, with the
//! origin that decides whether the registry's token may be sent.

/// Longest redirect `Location` or token realm followed: presigned CDN URLs
/// run past a kilobyte, none is near this.
const MAX_URL_CHARS: usize = 8 * 1024;

/// `host:port` of an https URL, lowercase, port 443 made explicit: two
/// URLs are one origin when these are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Origin(pub(super) String);

impl Origin {
    pub(super) fn of(host: &str, port: Option<u16>) -> Self {
        Self(format!(
            "{}:{}",
            host.to_ascii_lowercase(),
            port.unwrap_or(443)
        ))
    }
}

/// Why a redirect target or realm cannot be followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LocationError {
    NotHttps,
    Invalid(&'static str),
}

/// An absolute https URL to request, and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Hop {
    pub(super) url: String,
    pub(super) origin: Origin,
    /// Index in `url` where the path starts (after the authority).
    pub(super) path_at: usize,
}

impl Hop {
    /// An absolute URL: `https://` (scheme case-insensitive), a host with
    /// an optional port, no credentials; the fragment is dropped.
    pub(super) fn parse(v: &str) -> Result<Self, LocationError> {
        if v.len() > MAX_URL_CHARS {
            return Err(LocationError::Invalid("longer than 8 KiB"));
        }
        if !v.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LocationError::Invalid(
                "contains whitespace, control or non-ASCII characters",
            ));
        }
        let v = v.split('#').next().unwrap_or_default();
        let Some((scheme, rest)) = v.split_once("://") else {
            return Err(LocationError::Invalid("not an absolute URL"));
        };
        if !scheme.eq_ignore_ascii_case("https") {
            return Err(LocationError::NotHttps);
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let authority = &rest[..end];
        if authority.contains('@') {
            return Err(LocationError::Invalid(
                "credentials in the URL are not allowed",
            ));
        }
        let port_of = |p: &str| {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or(LocationError::Invalid("invalid port"))
        };
        let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
            let close = inner
                .find(']')
                .ok_or(LocationError::Invalid("invalid host"))?;
            let after = &inner[close + 1..];
            let port = match after.strip_prefix(':') {
                Some(p) => Some(port_of(p)?),
                None if after.is_empty() => None,
                None => return Err(LocationError::Invalid("invalid host")),
            };
            let address = &inner[..close];
            if address.is_empty()
                || !address
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
            {
                return Err(LocationError::Invalid("invalid host"));
            }
            (&authority[..close + 2], port)
        } else {
            let (host, port) = match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(port_of(p)?)),
                None => (authority, None),
            };
            if !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                return Err(LocationError::Invalid("invalid host"));
            }
            (host, port)
        };
        if host.is_empty() {
            return Err(LocationError::Invalid("no host"));
        }
        let mut url = format!("https://{}", &rest[..end]);
        let path_at = url.len();
        match &rest[end..] {
            "" => url.push('/'),
            p if p.starts_with('?') => {
                url.push('/');
                url.push_str(p);
            }
            p => url.push_str(p),
        }
        Ok(Self {
            url,
            origin: Origin::of(host, port),
            path_at,
        })
    }

    /// `location` (absolute, scheme-relative, absolute-path or relative)
    /// resolved against this URL.
    pub(super) fn resolve(&self, location: &str) -> Result<Self, LocationError> {
        if location.is_empty() {
            return Err(LocationError::Invalid("the redirect has no Location"));
        }
        let scheme_end = location.find(':');
        let first_delimiter = location.find(['/', '?', '#']);
        let has_scheme = match (scheme_end, first_delimiter) {
            (Some(c), Some(d)) => c < d,
            (Some(_), None) => true,
            _ => false,
        };
        if has_scheme {
            return Self::parse(location);
        }
        let authority_end = self.path_at;
        let target = if location.starts_with("//") {
            format!("https:{location}")
        } else if location.starts_with('/') {
            format!("{}{location}", &self.url[..authority_end])
        } else {
            let path = self.url[authority_end..].split('?').next().unwrap_or("/");
            if location.starts_with('?') {
                format!("{}{path}{location}", &self.url[..authority_end])
            } else {
                let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
                format!("{}{dir}{location}", &self.url[..authority_end])
            }
        };
        Self::parse(&target)
    }
}
