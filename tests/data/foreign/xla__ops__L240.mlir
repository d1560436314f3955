func.func @all_reduce_invalid_return_type(%operand: tensor<10xf32>) -> tensor<10xi32> {
  // expected-error@+2 {{'mhlo.all_reduce' op inferred type(s) 'tensor<10xf32>' are incompatible with return type(s) of operation 'tensor<10xi32>'}}
  // expected-error@+1 {{'mhlo.all_reduce' op failed to infer returned types}}
  %0 = "mhlo.all_reduce"(%operand) <{
    replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>
  }> ({
  ^bb0(%arg0: tensor<f32>, %arg1: tensor<f32>):
    %max = mhlo.maximum %arg0, %arg1 : tensor<f32>
    "mhlo.return"(%max) : (tensor<f32>) -> ()
  }) : (tensor<10xf32>) -> tensor<10xi32>
  func.return %0 : tensor<10xi32>
}
