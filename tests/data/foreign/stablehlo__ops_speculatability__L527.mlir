// CHECK-LABEL: func @all_reduce
// CHECK-NEXT:  return
func.func @all_reduce(%static_arg: tensor<2xf64>, %dynamic_arg: tensor<?xf64>) {
  %0 = "stablehlo.all_reduce"(%static_arg) ({
    ^bb0(%arg0: tensor<f64>, %arg1: tensor<f64>):
      stablehlo.return %arg0 : tensor<f64>
  }) {
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    channel_handle = #stablehlo.channel_handle<handle = 0, type = 0>
  } : (tensor<2xf64>) -> tensor<2xf64>
  "hlo_test_speculatability.is_speculatable"(%0) : (tensor<2xf64>) -> ()

  %1 = "stablehlo.all_reduce"(%static_arg) ({
    ^bb0(%arg0: tensor<f64>, %arg1: tensor<f64>):
      stablehlo.return %arg0 : tensor<f64>
  }) {
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    channel_handle = #stablehlo.channel_handle<handle = 0, type = 0>
  } : (tensor<2xf64>) -> tensor<?xf64>
  "hlo_test_speculatability.is_speculatable"(%1) : (tensor<?xf64>) -> ()

  %2 = "stablehlo.all_reduce"(%dynamic_arg) ({
    ^bb0(%arg0: tensor<f64>, %arg1: tensor<f64>):
      stablehlo.return %arg0 : tensor<f64>
  }) {
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    channel_handle = #stablehlo.channel_handle<handle = 0, type = 0>
  } : (tensor<?xf64>) -> tensor<2xf64>
  "hlo_test_speculatability.is_not_speculatable"(%2) : (tensor<2xf64>) -> ()

  %3 = "stablehlo.all_reduce"(%dynamic_arg) ({
    ^bb0(%arg0: tensor<f64>, %arg1: tensor<f64>):
      stablehlo.return %arg0 : tensor<f64>
  }) {
    replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
    channel_handle = #stablehlo.channel_handle<handle = 0, type = 0>
  } : (tensor<?xf64>) -> tensor<?xf64>
  "hlo_test_speculatability.is_speculatable"(%3) : (tensor<?xf64>) -> ()
  return
}
