//! Authentication of every RPC with the cluster's shared bearer token.

use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Server side: accepts only `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct CheckToken {
    /// The whole expected header value, `Bearer <token>`.
    expected: std::sync::Arc<[u8]>,
}

impl CheckToken {
    pub fn new(token: &str) -> Self {
        Self { expected: format!("Bearer {token}").into_bytes().into() }
    }
}

impl Interceptor for CheckToken {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(got) = req.metadata().get("authorization") else {
            return Err(Status::unauthenticated("missing authorization: Bearer <token> (security.token_file)"));
        };
        // Constant time: the comparison must not reveal how much of a guess was right.
        if bool::from(got.as_bytes().ct_eq(&self.expected)) {
            Ok(req)
        } else {
            Err(Status::unauthenticated("wrong cluster token (compare security.token_file on both hosts)"))
        }
    }
}

/// Client side: adds the token to every request.
#[derive(Clone)]
pub struct AddToken {
    /// `Bearer <token>`, parsed once.
    value: MetadataValue<tonic::metadata::Ascii>,
}

impl AddToken {
    /// Errors when the token has characters a header cannot carry.
    pub fn new(token: &str) -> Result<Self, String> {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| "the cluster token must be printable ASCII without newlines".to_string())?;
        Ok(Self { value })
    }
}

impl Interceptor for AddToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert("authorization", self.value.clone());
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_right_token() {
        let mut check = CheckToken::new("s3cret");
        assert_eq!(check.call(Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
        let mut wrong = AddToken::new("s3cres").unwrap();
        let req = wrong.call(Request::new(())).unwrap();
        assert_eq!(check.call(req).unwrap_err().code(), tonic::Code::Unauthenticated);
        let mut right = AddToken::new("s3cret").unwrap();
        assert!(check.call(right.call(Request::new(())).unwrap()).is_ok());
    }
}
