pub struct B(crate::a::A);
