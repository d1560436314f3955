// CHECK-LABEL: func @all_reduce_with_promotable_types
func.func @all_reduce_with_promotable_types(%operand: tensor<f32>) -> tensor<f64> {

  %result = "mhlo.all_reduce"(%operand) <{
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    channel_handle = #mhlo.channel_handle<handle = 0, type = 0>
  }> ({
    ^bb0(%arg0: tensor<f64>, %arg1: tensor<f64>):
      %0 = "mhlo.add"(%arg0, %arg1) : (tensor<f64>, tensor<f64>) -> tensor<f64>
      "mhlo.return"(%0) : (tensor<f64>) -> ()
  }) : (tensor<f32>) -> tensor<f64>

  func.return %result : tensor<f64>
}
