use super::b::{self, B};

pub struct A;
